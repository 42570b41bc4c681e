"""LTX-2 video VAE (encoder and decoder) in MLX.

Ports `ltx_core.model.video_vae`: causal 3D convolutions, pixel-norm residual stages, depth-to-space
upsampling / space-to-depth downsampling, 4x4 spatial patchify, per-channel latent statistics and the
optional timestep-conditioned decoder. Every width and the block lists come from the checkpoint's
embedded config section `cfg["vae"]`, read with the reference configurator's defaults.

Public layouts are the reference ones (B, C, F, H, W); inside, tensors are channels-last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ltx_engine.models.vae_blocks import (
    CausalConv3d,
    CombinedTimestepEmbedder,
    DepthToSpaceUpsample,
    PerChannelStatistics,
    ResnetBlock3D,
    SpaceToDepthDownsample,
    UNetMidBlock3D,
    apply_norm,
    make_norm,
    patchify,
    unpatchify,
)

_STRIDES = {"time": (2, 1, 1), "space": (1, 2, 2), "all": (2, 2, 2)}
_LOG_VAR_EXTRA = {"per_channel": None, "uniform": 1, "constant": 1, "none": 0}


@dataclass
class VideoVAEConfig:
    """The embedded config's `vae` section, defaults as in the reference configurators."""

    dims: int = 3
    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 128
    patch_size: int = 4
    norm_layer: str = "pixel_norm"
    latent_log_var: str = "uniform"
    encoder_blocks: list = field(default_factory=list)
    decoder_blocks: list = field(default_factory=list)
    encoder_spatial_padding_mode: str = "zeros"
    decoder_spatial_padding_mode: str = "reflect"
    causal_decoder: bool = False
    timestep_conditioning: bool = True
    decoder_base_channels: int = 128
    # Fixed in the reference decoder, not part of the config.
    decode_noise_scale: float = 0.025
    decode_timestep: float = 0.05

    @classmethod
    def from_config(cls, cfg: dict) -> VideoVAEConfig:
        """Accepts the whole embedded config (with a `vae` section) or the section itself."""
        vae = cfg.get("vae", cfg) if isinstance(cfg.get("vae"), dict) else cfg
        return cls(
            dims=vae.get("dims", 3),
            in_channels=vae.get("in_channels", 3),
            out_channels=vae.get("out_channels", 3),
            latent_channels=vae.get("latent_channels", 128),
            patch_size=vae.get("patch_size", 4),
            norm_layer=vae.get("norm_layer", "pixel_norm"),
            latent_log_var=vae.get("latent_log_var", "uniform"),
            encoder_blocks=list(vae.get("encoder_blocks", [])),
            decoder_blocks=list(vae.get("decoder_blocks", [])),
            encoder_spatial_padding_mode=vae.get("spatial_padding_mode", "zeros"),
            decoder_spatial_padding_mode=vae.get("spatial_padding_mode", "reflect"),
            causal_decoder=vae.get("causal_decoder", False),
            timestep_conditioning=vae.get("timestep_conditioning", True),
            decoder_base_channels=vae.get("decoder_base_channels", 128),
        )

    @property
    def time_factor(self) -> int:
        """Pixel frames per latent frame step (8 for LTX-2), from the encoder's temporal strides."""
        factor = 1
        for name, _ in self.encoder_blocks or self.decoder_blocks:
            if name.startswith(("compress_time", "compress_all")):
                factor *= 2
        return factor


def tiny_config() -> dict:
    """`vae` section of the tiny pack: the LTX-2.3 block layout (8x time, 32x space) at tiny widths.

    The encoder's width starts at latent_channels (128) as in the reference, so its stages carry
    no residual layers above 1/8 resolution to keep CPU tests fast.
    """
    return {
        "_class_name": "CausalVideoAutoencoder",
        "dims": 3,
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 128,
        "patch_size": 4,
        "norm_layer": "pixel_norm",
        "latent_log_var": "uniform",
        "spatial_padding_mode": "zeros",
        "causal_decoder": False,
        "timestep_conditioning": False,
        "decoder_base_channels": 4,
        "encoder_blocks": [
            ["compress_space_res", {"multiplier": 1}],
            ["compress_time_res", {"multiplier": 1}],
            ["compress_all_res", {"multiplier": 1}],
            ["res_x", {"num_layers": 1}],
            ["compress_all_res", {"multiplier": 1}],
            ["res_x", {"num_layers": 1}],
        ],
        "decoder_blocks": [
            ["res_x", {"num_layers": 1}],
            ["compress_space", {"multiplier": 2}],
            ["res_x", {"num_layers": 1}],
            ["compress_time", {"multiplier": 2}],
            ["res_x", {"num_layers": 1}],
            ["compress_all", {"multiplier": 1, "residual": True}],
            ["res_x", {"num_layers": 1}],
            ["compress_all", {"multiplier": 2, "residual": True}],
            ["res_x", {"num_layers": 1}],
        ],
    }


def _block_params(params: Any) -> dict:
    return {"num_layers": params} if isinstance(params, int) else dict(params)


def _check_dims(cfg: VideoVAEConfig) -> None:
    if cfg.dims != 3:
        raise NotImplementedError(f"video VAE with dims={cfg.dims}: only 3D convolutions are ported")


def _encoder_block(name: str, params: dict, ch: int, cfg: VideoVAEConfig) -> tuple[nn.Module, int]:
    pad = cfg.encoder_spatial_padding_mode
    if name == "res_x":
        return UNetMidBlock3D(ch, params["num_layers"], cfg.norm_layer, spatial_padding_mode=pad), ch
    mult = params.get("multiplier", 2)
    if name == "res_x_y":
        return ResnetBlock3D(ch, ch * mult, cfg.norm_layer, spatial_padding_mode=pad), ch * mult
    kind = name.removeprefix("compress_")
    if kind in ("time", "space", "all"):
        return CausalConv3d(ch, ch, 3, stride=_STRIDES[kind], spatial_padding_mode=pad), ch
    if kind == "all_x_y":
        return CausalConv3d(ch, ch * mult, 3, stride=_STRIDES["all"], spatial_padding_mode=pad), ch * mult
    if kind.endswith("_res") and kind[:-4] in _STRIDES:
        block = SpaceToDepthDownsample(ch, ch * mult, _STRIDES[kind[:-4]], spatial_padding_mode=pad)
        return block, ch * mult
    raise ValueError(f"unknown encoder block {name!r}")


def _decoder_block(name: str, params: dict, ch: int, cfg: VideoVAEConfig) -> tuple[nn.Module, int]:
    pad = cfg.decoder_spatial_padding_mode
    noise = params.get("inject_noise", False)
    if name == "res_x":
        block = UNetMidBlock3D(
            ch, params["num_layers"], cfg.norm_layer, noise, cfg.timestep_conditioning, pad
        )
        return block, ch
    if name == "res_x_y":
        out = ch // params.get("multiplier", 2)
        return ResnetBlock3D(ch, out, cfg.norm_layer, noise, False, pad), out
    kind = name.removeprefix("compress_")
    if kind in _STRIDES:
        mult = params.get("multiplier", 1)
        residual = params.get("residual", False) if kind == "all" else False
        return DepthToSpaceUpsample(ch, _STRIDES[kind], residual, mult, pad), ch // mult
    raise ValueError(f"unknown decoder block {name!r}")


def _to_mx(value: Any) -> mx.array:
    return value if isinstance(value, mx.array) else mx.array(np.asarray(value))


def _sanitize(weights: dict, stats_names: dict[str, str]) -> dict[str, mx.array]:
    """Reference state dict -> our keys: conv kernels channels-last, statistics renamed, rest kept."""
    out: dict[str, mx.array] = {}
    for key, value in weights.items():
        key = key.removeprefix("vae.")
        if "per_channel_statistics." in key:
            stat = key.rsplit(".", 1)[-1]
            if stat in stats_names:
                out[f"per_channel_statistics.{stats_names[stat]}"] = _to_mx(value)
            continue  # other dataset statistics are unused by the reference model
        value = _to_mx(value)
        if value.ndim == 5:  # Conv3d (O, I, D, H, W) -> (O, D, H, W, I)
            value = value.transpose(0, 2, 3, 4, 1)
        out[key] = value
    return out


_REF_STATS = {"mean-of-means": "mean", "std-of-means": "std"}


def _with_last_scale_shift_table(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """A timestep-conditioned decoder stored without `last_scale_shift_table` gets zeros, as the
    converter documents (source checkpoints and packs both may lack it)."""
    lin = "last_time_embedder.timestep_embedder.linear_2.weight"
    if lin in weights and "last_scale_shift_table" not in weights:
        weights["last_scale_shift_table"] = mx.zeros((2, weights[lin].shape[0] // 2), dtype=weights[lin].dtype)
    return weights


class VideoDecoder(nn.Module):
    """Normalized latent (B, C, F, H, W) -> pixels (B, 3, 1 + 8(F-1), 32H, 32W) in about [-1, 1]."""

    @classmethod
    def from_config(cls, cfg: dict) -> VideoDecoder:
        """Built from the embedded (reference) config, as the pack registry builds every model."""
        return cls(VideoVAEConfig.from_config(cfg))

    def __init__(self, cfg: VideoVAEConfig):
        super().__init__()
        _check_dims(cfg)
        self.cfg = cfg
        self.causal = cfg.causal_decoder
        self.timestep_conditioning = cfg.timestep_conditioning
        self.per_channel_statistics = PerChannelStatistics(cfg.latent_channels)
        pad = cfg.decoder_spatial_padding_mode
        ch = cfg.decoder_base_channels * 8  # the reference's fixed 2**3 widening
        self.conv_in = CausalConv3d(cfg.latent_channels, ch, 3, spatial_padding_mode=pad)
        self.up_blocks = []
        for name, params in reversed(cfg.decoder_blocks):
            block, ch = _decoder_block(name, _block_params(params), ch, cfg)
            self.up_blocks.append(block)
        self.conv_norm_out = make_norm(cfg.norm_layer, ch)
        self.conv_out = CausalConv3d(ch, cfg.out_channels * cfg.patch_size**2, 3, spatial_padding_mode=pad)
        if cfg.timestep_conditioning:
            self.timestep_scale_multiplier = mx.array(1000.0)
            self.last_time_embedder = CombinedTimestepEmbedder(ch * 2)
            self.last_scale_shift_table = mx.zeros((2, ch))

    def _timestep(self, timestep: float | mx.array | None, batch: int) -> mx.array | None:
        if not self.timestep_conditioning:
            return None
        t = self.cfg.decode_timestep if timestep is None else timestep
        t = mx.broadcast_to(mx.array(t, dtype=mx.float32).reshape(-1), (batch,))
        return t * self.timestep_scale_multiplier.astype(mx.float32)

    def __call__(
        self,
        latent: mx.array,
        timestep: float | mx.array | None = None,
        *,
        key: mx.array | None = None,
        noise: mx.array | None = None,
    ) -> mx.array:
        """Decode. With timestep conditioning the reference blends in 2.5% noise: drawn from `key`
        (default key 0, so decoding stays deterministic) unless `noise` (latent-shaped) is given."""
        out_dtype = latent.dtype
        batch = latent.shape[0]
        if self.timestep_conditioning:
            if noise is None:
                noise = mx.random.normal(latent.shape, key=mx.random.key(0) if key is None else key)
            s = self.cfg.decode_noise_scale
            latent = noise.astype(latent.dtype) * s + (1.0 - s) * latent
        x = self.per_channel_statistics.un_normalize(latent.transpose(0, 2, 3, 4, 1))
        x = x.astype(self.conv_in.conv.weight.dtype)
        t = self._timestep(timestep, batch)
        block_keys = mx.random.split(key, len(self.up_blocks)) if key is not None else None
        x = self.conv_in(x, causal=self.causal)
        for i, block in enumerate(self.up_blocks):
            k = None if block_keys is None else block_keys[i]
            if isinstance(block, UNetMidBlock3D):
                x = block(x, causal=self.causal, timestep=t, key=k)
            elif isinstance(block, ResnetBlock3D):
                x = block(x, causal=self.causal, key=k)
            else:
                x = block(x, causal=self.causal)
        x = apply_norm(self.conv_norm_out, x)
        if self.timestep_conditioning:
            emb = self.last_time_embedder(t, x.dtype).reshape(batch, 2, -1)
            ada = self.last_scale_shift_table.astype(x.dtype)[None] + emb
            shift, scale = ada[:, 0, None, None, None, :], ada[:, 1, None, None, None, :]
            x = x * (1 + scale) + shift
        x = self.conv_out(nn.silu(x), causal=self.causal)
        x = unpatchify(x, self.cfg.patch_size)
        return x.transpose(0, 4, 1, 2, 3).astype(out_dtype)

    @staticmethod
    def sanitize(weights: dict) -> dict[str, mx.array]:
        """Reference keys (`vae.decoder.` stripped; `per_channel_statistics.*` included) -> ours."""
        return _with_last_scale_shift_table(_sanitize(weights, _REF_STATS))

    @staticmethod
    def pack_to_model(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """`vae_decoder.safetensors` keys (prefix stripped) -> ours: the same names."""
        return _with_last_scale_shift_table(dict(weights))

    @staticmethod
    def model_to_pack(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        return dict(weights)


class VideoEncoder(nn.Module):
    """Pixels (B, 3, F, H, W) in [-1, 1] -> normalized latent means (B, C, 1 + (F-1)/8, H/32, W/32)."""

    @classmethod
    def from_config(cls, cfg: dict) -> VideoEncoder:
        """Built from the embedded (reference) config, as the pack registry builds every model."""
        return cls(VideoVAEConfig.from_config(cfg))

    def __init__(self, cfg: VideoVAEConfig):
        super().__init__()
        _check_dims(cfg)
        if cfg.latent_log_var not in _LOG_VAR_EXTRA:
            raise ValueError(f"invalid latent_log_var {cfg.latent_log_var!r}")
        self.cfg = cfg
        self.per_channel_statistics = PerChannelStatistics(cfg.latent_channels)
        pad = cfg.encoder_spatial_padding_mode
        ch = cfg.latent_channels  # the reference starts the encoder at the latent width
        self.conv_in = CausalConv3d(cfg.in_channels * cfg.patch_size**2, ch, 3, spatial_padding_mode=pad)
        self.down_blocks = []
        for name, params in cfg.encoder_blocks:
            block, ch = _encoder_block(name, _block_params(params), ch, cfg)
            self.down_blocks.append(block)
        self.conv_norm_out = make_norm(cfg.norm_layer, ch)
        extra = _LOG_VAR_EXTRA[cfg.latent_log_var]
        out_ch = cfg.latent_channels * 2 if extra is None else cfg.latent_channels + extra
        self.conv_out = CausalConv3d(ch, out_ch, 3, spatial_padding_mode=pad)

    def __call__(self, pixels: mx.array) -> mx.array:
        frames = pixels.shape[2]
        crop = (frames - 1) % self.cfg.time_factor
        if crop:  # the reference crops to 1 + 8k frames
            pixels = pixels[:, :, : frames - crop]
        out_dtype = pixels.dtype
        x = pixels.transpose(0, 2, 3, 4, 1).astype(self.conv_in.conv.weight.dtype)
        x = self.conv_in(patchify(x, self.cfg.patch_size))
        for block in self.down_blocks:
            x = block(x)
        x = self.conv_out(nn.silu(apply_norm(self.conv_norm_out, x)))
        means = x[..., : self.cfg.latent_channels].astype(mx.float32)
        latent = self.per_channel_statistics.normalize(means)
        return latent.transpose(0, 4, 1, 2, 3).astype(out_dtype)

    @staticmethod
    def sanitize(weights: dict) -> dict[str, mx.array]:
        """Reference keys (`vae.encoder.` stripped; `per_channel_statistics.*` included) -> ours."""
        return _sanitize(weights, _REF_STATS)

    @staticmethod
    def pack_to_model(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """`vae_encoder.safetensors` stores `_mean_of_means`/`_std_of_means`; MLX hides `_` names."""
        return {_ENCODER_PACK_TO_MODEL.get(k, k): v for k, v in weights.items()}

    @staticmethod
    def model_to_pack(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        inverse = {v: k for k, v in _ENCODER_PACK_TO_MODEL.items()}
        return {inverse.get(k, k): v for k, v in weights.items()}


_ENCODER_PACK_TO_MODEL = {
    "per_channel_statistics._mean_of_means": "per_channel_statistics.mean",
    "per_channel_statistics._std_of_means": "per_channel_statistics.std",
}
