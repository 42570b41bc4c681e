"""Audio VAE decoder in MLX: normalized audio latent (B, z, T, F) -> mel spectrogram (B, 2, T', mel_bins).

Mirrors ltx_core.model.audio_vae.AudioDecoder. Tensors run channels-last inside as (B, time, freq, C)
(the reference's (B, C, H=time, W=freq)). Attribute paths equal the reference decoder's state-dict
keys; the pack file `audio_vae.safetensors` holds `audio_vae.decoder.*` (convs channels-last),
`audio_vae.encoder.*` and `audio_vae.per_channel_statistics._{mean,std}_of_means` -> `pack_to_model`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

LATENT_DOWNSAMPLE_FACTOR = 4  # mel frames per latent frame, fixed in the reference decoder
_ATTN_PARTS = ("q", "k", "v", "proj_out")


@dataclass
class AudioDecoderConfig:
    ch: int = 128
    out_ch: int = 2
    ch_mult: tuple[int, ...] = (1, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = (8, 16, 32)
    resolution: int = 256
    z_channels: int = 8
    norm_type: str = "pixel"
    causality_axis: str | None = "height"
    mid_block_add_attention: bool = True
    sample_rate: int = 16000
    mel_hop_length: int = 160
    is_causal: bool = True
    mel_bins: int | None = None

    @classmethod
    def from_config(cls, cfg: dict) -> AudioDecoderConfig:
        """Read cfg["audio_vae"] exactly as the reference AudioDecoderConfigurator does."""
        vae = cfg.get("audio_vae", {})
        params = vae.get("model", {}).get("params", {})
        dd = params.get("ddconfig", {})
        pre = vae.get("preprocessing", {})
        stft, mel = pre.get("stft", {}), pre.get("mel", {})
        mel_bins = dd.get("mel_bins") or mel.get("n_mel_channels") or vae.get("variables", {}).get("mel_bins")
        return cls(
            ch=dd.get("ch", 128),
            out_ch=dd.get("out_ch", 2),
            ch_mult=tuple(dd.get("ch_mult", (1, 2, 4))),
            num_res_blocks=dd.get("num_res_blocks", 2),
            attn_resolutions=tuple(dd.get("attn_resolutions", (8, 16, 32)) or ()),
            resolution=dd.get("resolution", 256),
            z_channels=dd.get("z_channels", 8),
            norm_type=dd.get("norm_type", "pixel"),
            causality_axis=dd.get("causality_axis", "height"),
            mid_block_add_attention=dd.get("mid_block_add_attention", True),
            sample_rate=params.get("sampling_rate", 16000),
            mel_hop_length=stft.get("hop_length", 160),
            is_causal=stft.get("causal", True),
            mel_bins=mel_bins,
        )

    @property
    def stats_channels(self) -> int:
        """Width of the patchified latent (z * latent mel bins); equals `ch` in every released config."""
        if self.mel_bins is None:
            return self.ch
        return self.z_channels * (self.mel_bins // 2 ** (len(self.ch_mult) - 1))


def tiny_config() -> dict:
    """The 2.3 audio VAE section (causal, pixel norm, no attention) with tiny channels.

    Latent (B, 8, T, 16) and mel (B, 2, 4T-3, 64) keep the real shapes, so the vocoder input is real.
    """
    return {"audio_vae": {
        "model": {"params": {"sampling_rate": 16000, "ddconfig": {
            "ch": 16, "out_ch": 2, "ch_mult": [1, 2, 4], "num_res_blocks": 1, "attn_resolutions": [],
            "resolution": 256, "z_channels": 8, "double_z": True, "norm_type": "pixel",
            "causality_axis": "height", "dropout": 0.0, "mid_block_add_attention": False,
            "in_channels": 2, "mel_bins": 64}}},
        "preprocessing": {"stft": {"hop_length": 160, "filter_length": 1024, "causal": True},
                          "mel": {"n_mel_channels": 64}},
    }}


def _norm(channels: int, norm_type: str) -> nn.Module | None:
    if norm_type == "group":
        return nn.GroupNorm(32, channels, eps=1e-6, pytorch_compatible=True)
    if norm_type == "pixel":
        return None  # PixelNorm has no parameters
    raise ValueError(f"unknown norm_type {norm_type!r}")


def _apply_norm(norm: nn.Module | None, x: mx.array) -> mx.array:
    return mx.fast.rms_norm(x, None, 1e-6) if norm is None else norm(x)


class CausalConv2d(nn.Module):
    """Conv2d padded so a time step sees only itself and the past (reference CausalConv2d)."""

    def __init__(self, cin: int, cout: int, kernel_size: int, causality_axis: str | None):
        super().__init__()
        ph = pw = kernel_size - 1
        if causality_axis is None:
            self.pad = ((ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2))
        elif causality_axis in ("width", "width-compatibility"):
            self.pad = ((ph // 2, ph - ph // 2), (pw, 0))
        elif causality_axis == "height":
            self.pad = ((ph, 0), (pw // 2, pw - pw // 2))
        else:
            raise ValueError(f"invalid causality_axis {causality_axis!r}")
        self.conv = nn.Conv2d(cin, cout, kernel_size=kernel_size)

    def __call__(self, x: mx.array) -> mx.array:
        if any(self.pad[0]) or any(self.pad[1]):
            x = mx.pad(x, [(0, 0), self.pad[0], self.pad[1], (0, 0)])
        return self.conv(x)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, norm_type: str, causality_axis: str | None):
        super().__init__()
        self.norm1 = _norm(cin, norm_type)
        self.conv1 = CausalConv2d(cin, cout, 3, causality_axis)
        self.norm2 = _norm(cout, norm_type)
        self.conv2 = CausalConv2d(cout, cout, 3, causality_axis)
        if cin != cout:
            self.nin_shortcut = CausalConv2d(cin, cout, 1, causality_axis)

    def __call__(self, x: mx.array) -> mx.array:
        h = self.conv1(nn.silu(_apply_norm(self.norm1, x)))
        h = self.conv2(nn.silu(_apply_norm(self.norm2, h)))
        if "nin_shortcut" in self:
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all (time, freq) positions; 1x1 convs held as Linear."""

    def __init__(self, channels: int, norm_type: str):
        super().__init__()
        self.norm = _norm(channels, norm_type)
        self.q = nn.Linear(channels, channels)
        self.k = nn.Linear(channels, channels)
        self.v = nn.Linear(channels, channels)
        self.proj_out = nn.Linear(channels, channels)

    def __call__(self, x: mx.array) -> mx.array:
        b, h, w, c = x.shape
        y = _apply_norm(self.norm, x)
        q, k, v = (m(y).reshape(b, 1, h * w, c) for m in (self.q, self.k, self.v))
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=c**-0.5)
        return x + self.proj_out(o.reshape(b, h, w, c))


class Upsample(nn.Module):
    """Nearest x2 on both axes, causal conv, then drop the first step on the causal axis."""

    def __init__(self, channels: int, causality_axis: str | None):
        super().__init__()
        self.causality_axis = causality_axis
        self.conv = CausalConv2d(channels, channels, 3, causality_axis)

    def __call__(self, x: mx.array) -> mx.array:
        x = mx.repeat(mx.repeat(x, 2, axis=1), 2, axis=2)
        x = self.conv(x)
        if self.causality_axis == "height":
            return x[:, 1:]
        if self.causality_axis == "width":
            return x[:, :, 1:]
        return x


class MidBlock(nn.Module):
    def __init__(self, channels: int, cfg: AudioDecoderConfig):
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels, cfg.norm_type, cfg.causality_axis)
        if cfg.mid_block_add_attention:
            self.attn_1 = AttnBlock(channels, cfg.norm_type)
        self.block_2 = ResnetBlock(channels, channels, cfg.norm_type, cfg.causality_axis)

    def __call__(self, x: mx.array) -> mx.array:
        x = self.block_1(x)
        if "attn_1" in self:
            x = self.attn_1(x)
        return self.block_2(x)


class UpStage(nn.Module):
    def __init__(self, block: list, attn: list, upsample: Upsample | None):
        super().__init__()
        self.block = block
        self.attn = attn
        if upsample is not None:
            self.upsample = upsample


def _build_up_path(cfg: AudioDecoderConfig, block_in: int) -> tuple[list[UpStage], int]:
    """Stages indexed by level (up.0 is the finest); the decoder runs them from the last to the first."""
    n = len(cfg.ch_mult)
    res = cfg.resolution // 2 ** (n - 1)
    stages: list[UpStage] = []
    for level in reversed(range(n)):
        block_out = cfg.ch * cfg.ch_mult[level]
        blocks, attns = [], []
        for _ in range(cfg.num_res_blocks + 1):
            blocks.append(ResnetBlock(block_in, block_out, cfg.norm_type, cfg.causality_axis))
            block_in = block_out
            if res in cfg.attn_resolutions:
                attns.append(AttnBlock(block_in, cfg.norm_type))
        up = None
        if level != 0:
            up = Upsample(block_in, cfg.causality_axis)
            res *= 2
        stages.insert(0, UpStage(blocks, attns, up))
    return stages, block_in


class PerChannelStatistics(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.mean = mx.zeros((channels,))
        self.std = mx.ones((channels,))


class AudioDecoder(nn.Module):
    """Normalized audio latent (B, z, T, F) -> mel spectrogram (B, out_ch, T', mel_bins), reference layout."""

    def __init__(self, config: AudioDecoderConfig):
        super().__init__()
        self.config = cfg = config
        base = cfg.ch * cfg.ch_mult[-1]
        self.per_channel_statistics = PerChannelStatistics(cfg.stats_channels)
        self.conv_in = CausalConv2d(cfg.z_channels, base, 3, cfg.causality_axis)
        self.mid = MidBlock(base, cfg)
        self.up, final = _build_up_path(cfg, base)
        self.norm_out = _norm(final, cfg.norm_type)
        self.conv_out = CausalConv2d(final, cfg.out_ch, 3, cfg.causality_axis)

    @classmethod
    def from_config(cls, cfg: dict) -> AudioDecoder:
        return cls(AudioDecoderConfig.from_config(cfg))

    def _target_shape(self, frames: int, mel_bins: int) -> tuple[int, int]:
        t = frames * LATENT_DOWNSAMPLE_FACTOR
        if self.config.causality_axis is not None:
            t = max(t - (LATENT_DOWNSAMPLE_FACTOR - 1), 1)
        return t, self.config.mel_bins if self.config.mel_bins is not None else mel_bins

    def __call__(self, latent: mx.array) -> mx.array:
        b, c, t, f = latent.shape
        dtype = self.conv_in.conv.weight.dtype
        stats = self.per_channel_statistics
        # The statistics index the patchified latent "b t (c f)", i.e. channel-major over (c, f).
        x = latent.astype(mx.float32) * stats.std.reshape(1, c, 1, f) + stats.mean.reshape(1, c, 1, f)
        x = x.transpose(0, 2, 3, 1).astype(dtype)  # (B, T, F, C)
        x = self.mid(self.conv_in(x))
        for level in reversed(range(len(self.up))):
            stage = self.up[level]
            for i, block in enumerate(stage.block):
                x = block(x)
                if stage.attn:
                    x = stage.attn[i](x)
            if level != 0 and "upsample" in stage:
                x = stage.upsample(x)
        x = self.conv_out(nn.silu(_apply_norm(self.norm_out, x)))
        return self._fit(x.transpose(0, 3, 1, 2).astype(mx.float32), *self._target_shape(t, f))

    def _fit(self, x: mx.array, t: int, f: int) -> mx.array:
        """Crop, then zero-pad, to (out_ch, t, f) as the reference `_adjust_output_shape`."""
        x = x[:, : self.config.out_ch, :t, :f]
        pt, pf = t - x.shape[2], f - x.shape[3]
        if pt > 0 or pf > 0:
            x = mx.pad(x, [(0, 0), (0, 0), (0, max(pt, 0)), (0, max(pf, 0))])
        return x

    @staticmethod
    def _rename(key: str) -> str | None:
        if key.startswith("encoder."):
            return None
        key = key.removeprefix("decoder.")
        for old, new in (("mean-of-means", "mean"), ("std-of-means", "std"),
                         ("_mean_of_means", "mean"), ("_std_of_means", "std")):
            if key.startswith("per_channel_statistics.") and key.endswith(old):
                return "per_channel_statistics." + new
        return key

    @staticmethod
    def _is_attn_weight(key: str) -> bool:
        parts = key.split(".")
        return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in _ATTN_PARTS

    @staticmethod
    def sanitize(weights: dict) -> dict[str, mx.array]:
        """Reference keys (an `audio_vae.` state dict or the decoder's own) -> ours, float32, convs NHWC."""
        return reference_to_model(weights, AudioDecoder._rename)

    @staticmethod
    def pack_to_model(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Pack file keys (`audio_vae.` stripped; convs already channels-last) -> ours, float32.

        The converter leaves 1x1 attention weights (no "conv" in their key) in torch layout; both
        layouts flatten to the same (O, I) Linear weight.
        """
        return pack_weights_to_model(weights, AudioDecoder._rename)

    @staticmethod
    def model_to_pack(params: dict[str, mx.array]) -> dict[str, mx.array]:
        """Our flat parameters -> the pack file's keys (without the `audio_vae.` prefix)."""
        out = {}
        for key, value in params.items():
            if key.startswith("per_channel_statistics."):
                out[f"per_channel_statistics._{key.rsplit('.', 1)[1]}_of_means"] = value
            else:
                out["decoder." + key] = value
        return out


def reference_to_model(weights: dict, rename: Callable[[str], str | None]) -> dict[str, mx.array]:
    """A reference (torch-layout) audio VAE state dict -> our keys (`rename`; None drops a key), float32,
    convs NHWC, attention 1x1 weights flattened: the encoder's and the decoder's one conversion."""
    out = {}
    for key, value in weights.items():
        name = rename(key)
        if name is None:
            continue
        v = np.asarray(value, dtype=np.float32) if not isinstance(value, mx.array) else value
        if AudioDecoder._is_attn_weight(name):
            v = v.reshape(v.shape[0], -1)
        elif v.ndim == 4:
            v = v.transpose(0, 2, 3, 1)
        out[name] = mx.array(v).astype(mx.float32)
    return out


def pack_weights_to_model(weights: dict[str, mx.array], rename: Callable[[str], str | None]) -> dict[str, mx.array]:
    """Pack file tensors (convs already channels-last) -> our keys, float32, attention weights flattened."""
    out = {}
    for key, value in weights.items():
        name = rename(key)
        if name is None:
            continue
        if AudioDecoder._is_attn_weight(name):
            value = value.reshape(value.shape[0], -1)
        out[name] = value.astype(mx.float32)
    return out
