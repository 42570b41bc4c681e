"""Audio VAE encoder in MLX: log-mel spectrogram (B, C, T, mel_bins) -> normalized latent (B, z, T', F').

Mirrors ltx_core.model.audio_vae.AudioEncoder (down path of causal convs, strided downsampling, the
mid block, then the mean half of the `double_z` output normalized by the shared per-channel
statistics over the patchified latent "b t (c f)"). Runs channels-last inside like the decoder, whose
blocks it reuses. Attribute paths equal the reference encoder's state-dict keys; the pack holds them as
`audio_vae.encoder.*` (convs channels-last) beside the decoder, and the statistics are the VAE's one
`audio_vae.per_channel_statistics` pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ltx_engine.models.audio_mel import MelConfig, log_mel
from ltx_engine.models.audio_vae import (
    AttnBlock,
    AudioDecoder,
    AudioDecoderConfig,
    CausalConv2d,
    MidBlock,
    PerChannelStatistics,
    ResnetBlock,
    _apply_norm,
    _norm,
    pack_weights_to_model,
    reference_to_model,
)

# (time_before, time_after), (freq_before, freq_after) of the strided downsampling conv, per causal axis.
_DOWN_PAD = {
    None: ((0, 1), (0, 1)),
    "width": ((0, 1), (2, 0)),
    "height": ((2, 0), (0, 1)),
    "width-compatibility": ((0, 1), (1, 0)),
}


@dataclass
class AudioEncoderConfig(AudioDecoderConfig):
    in_channels: int = 2
    double_z: bool = True
    n_fft: int = 1024

    @classmethod
    def from_config(cls, cfg: dict) -> AudioEncoderConfig:
        """Read cfg["audio_vae"] as the reference AudioEncoderConfigurator does."""
        base = AudioDecoderConfig.from_config(cfg)
        vae = cfg.get("audio_vae", {})
        dd = vae.get("model", {}).get("params", {}).get("ddconfig", {})
        n_fft = vae.get("preprocessing", {}).get("stft", {}).get("filter_length", 1024)
        fields = {k: getattr(base, k) for k in AudioDecoderConfig.__dataclass_fields__}
        return cls(**fields, in_channels=dd.get("in_channels", 2), double_z=dd.get("double_z", True), n_fft=n_fft)

    @property
    def mel(self) -> MelConfig:
        """The front end's settings (the reference AudioProcessor's, built from the same config)."""
        return MelConfig(self.sample_rate, self.n_fft, self.mel_hop_length, self.mel_bins or 64)


class Downsample(nn.Module):
    """Pad as the causal axis asks, then a stride-2 3x3 conv (the reference's `with_conv` path)."""

    def __init__(self, channels: int, causality_axis: str | None):
        super().__init__()
        if causality_axis not in _DOWN_PAD:
            raise ValueError(f"invalid causality_axis {causality_axis!r}")
        self.pad = _DOWN_PAD[causality_axis]
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, stride=2)

    def __call__(self, x: mx.array) -> mx.array:
        return self.conv(mx.pad(x, [(0, 0), self.pad[0], self.pad[1], (0, 0)]))


class DownStage(nn.Module):
    def __init__(self, block: list, attn: list, downsample: Downsample | None):
        super().__init__()
        self.block = block
        self.attn = attn
        if downsample is not None:
            self.downsample = downsample


def _build_down_path(cfg: AudioEncoderConfig) -> tuple[list[DownStage], int]:
    res, stages = cfg.resolution, []
    mults = (1, *cfg.ch_mult)
    block_in = cfg.ch
    for level, mult in enumerate(cfg.ch_mult):
        block_in, block_out = cfg.ch * mults[level], cfg.ch * mult
        blocks, attns = [], []
        for _ in range(cfg.num_res_blocks):
            blocks.append(ResnetBlock(block_in, block_out, cfg.norm_type, cfg.causality_axis))
            block_in = block_out
            if res in cfg.attn_resolutions:
                attns.append(AttnBlock(block_in, cfg.norm_type))
        down = None
        if level != len(cfg.ch_mult) - 1:
            down = Downsample(block_in, cfg.causality_axis)
            res //= 2
        stages.append(DownStage(blocks, attns, down))
    return stages, block_in


class AudioEncoder(nn.Module):
    """Log-mel (B, in_channels, T, mel_bins) -> normalized latent (B, z, T', mel_bins / 2**(levels-1))."""

    def __init__(self, config: AudioEncoderConfig):
        super().__init__()
        self.config = cfg = config
        self.per_channel_statistics = PerChannelStatistics(cfg.stats_channels)
        self.conv_in = CausalConv2d(cfg.in_channels, cfg.ch, 3, cfg.causality_axis)
        self.down, block_in = _build_down_path(cfg)
        self.mid = MidBlock(block_in, cfg)
        self.norm_out = _norm(block_in, cfg.norm_type)
        out = 2 * cfg.z_channels if cfg.double_z else cfg.z_channels
        self.conv_out = CausalConv2d(block_in, out, 3, cfg.causality_axis)

    @classmethod
    def from_config(cls, cfg: dict) -> AudioEncoder:
        return cls(AudioEncoderConfig.from_config(cfg))

    def _down(self, x: mx.array) -> mx.array:
        for stage in self.down:
            for i, block in enumerate(stage.block):
                x = block(x)
                if stage.attn:
                    x = stage.attn[i](x)
            if "downsample" in stage:
                x = stage.downsample(x)
        return x

    def _normalize(self, means: mx.array) -> mx.array:
        """(B, z, T, F) means -> normalized over the patchified "b t (c f)" channels, same layout back."""
        _, c, _, f = means.shape
        stats = self.per_channel_statistics
        return (means - stats.mean.reshape(1, c, 1, f)) / stats.std.reshape(1, c, 1, f)

    def __call__(self, mel: mx.array) -> mx.array:
        dtype = self.conv_in.conv.weight.dtype
        x = mel.transpose(0, 2, 3, 1).astype(dtype)  # (B, T, F, C)
        x = self.mid(self._down(self.conv_in(x)))
        x = self.conv_out(nn.silu(_apply_norm(self.norm_out, x)))
        # The reference keeps the first torch.chunk(., 2) half even without double_z (its docstring says otherwise).
        means = x[..., : -(-x.shape[-1] // 2)]
        return self._normalize(means.transpose(0, 3, 1, 2).astype(mx.float32))

    def encode_waveform(self, waveform: mx.array) -> mx.array:
        """Waveform (B, C, N) at the VAE's sample rate -> normalized latent, as `encode_audio` upstream."""
        return self(log_mel(waveform, self.config.mel))

    @staticmethod
    def _rename(key: str) -> str | None:
        if key.startswith("decoder."):
            return None
        if key.startswith("per_channel_statistics."):
            return AudioDecoder._rename(key)
        return key.removeprefix("encoder.")

    @staticmethod
    def sanitize(weights: dict) -> dict[str, mx.array]:
        """Reference keys (`encoder.*` + `per_channel_statistics.*`) -> ours, float32, convs NHWC."""
        return reference_to_model(weights, AudioEncoder._rename)

    @staticmethod
    def pack_to_model(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Pack file keys (`audio_vae.` stripped; convs channels-last) -> ours, float32."""
        return pack_weights_to_model(weights, AudioEncoder._rename)

    @staticmethod
    def model_to_pack(params: dict[str, mx.array]) -> dict[str, mx.array]:
        """Our flat parameters, less the shared statistics (the decoder writes them) -> `encoder.*` keys."""
        return {"encoder." + k: v for k, v in params.items() if not k.startswith("per_channel_statistics.")}
