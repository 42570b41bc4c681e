"""Latent upsamplers (spatial x2 / x1.5 and temporal x2) in MLX.

Mirrors ltx_core.model.upsampler: initial conv -> GroupNorm -> SiLU -> res blocks -> upsampler ->
res blocks -> final conv. Tensors run channels-last inside (B, F, H, W, C); the public call takes and
returns the reference layout (B, C, F, H, W). Attribute paths equal the checkpoint's keys, so a pack
file `<name>.safetensors` (keys `<name>.initial_conv.weight`, ...) loads after stripping `<name>.`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

# The reference maps a spatial scale to (up by num via pixel shuffle, down by den via blur).
_RATIONAL = {0.75: (3, 4), 1.5: (3, 2), 2.0: (2, 1), 4.0: (4, 1)}
_GROUPS = 32  # torch.nn.GroupNorm(32, ...) in the reference


@dataclass
class UpsamplerConfig:
    in_channels: int = 128
    mid_channels: int = 512
    num_blocks_per_stage: int = 4
    dims: int = 3
    spatial_upsample: bool = True
    temporal_upsample: bool = False
    spatial_scale: float = 2.0
    rational_resampler: bool = False

    @classmethod
    def from_config(cls, cfg: dict) -> UpsamplerConfig:
        """Read the dict the reference configurator reads; a pack's `*_config.json` wraps it in "config"."""
        if isinstance(cfg.get("config"), dict):
            cfg = cfg["config"]
        return cls(
            in_channels=cfg.get("in_channels", 128),
            mid_channels=cfg.get("mid_channels", 512),
            num_blocks_per_stage=cfg.get("num_blocks_per_stage", 4),
            dims=cfg.get("dims", 3),
            spatial_upsample=cfg.get("spatial_upsample", True),
            temporal_upsample=cfg.get("temporal_upsample", False),
            spatial_scale=float(cfg.get("spatial_scale", 2.0)),
            rational_resampler=cfg.get("rational_resampler", False),
        )


def tiny_spatial_config() -> dict:
    """The x2 spatial upsampler's released layout (Conv2d + pixel shuffle) at tiny width."""
    return {"config": {"_class_name": "LatentUpsampler", "in_channels": 128, "mid_channels": 32,
                       "num_blocks_per_stage": 2, "dims": 3, "spatial_upsample": True,
                       "temporal_upsample": False, "spatial_scale": 2.0, "rational_resampler": False}}


def tiny_temporal_config() -> dict:
    """The x2 temporal upsampler's released layout (Conv3d + temporal shuffle) at tiny width."""
    return {"config": {"_class_name": "LatentUpsampler", "in_channels": 128, "mid_channels": 32,
                       "num_blocks_per_stage": 2, "dims": 3, "spatial_upsample": False,
                       "temporal_upsample": True, "spatial_scale": 1.0, "rational_resampler": True}}


def _conv(dims: int, cin: int, cout: int) -> nn.Module:
    return (nn.Conv2d if dims == 2 else nn.Conv3d)(cin, cout, kernel_size=3, padding=1)


def _frames_to_batch(x: mx.array) -> tuple[mx.array, tuple[int, int]]:
    b, f = x.shape[:2]
    return x.reshape(b * f, *x.shape[2:]), (b, f)


def _batch_to_frames(x: mx.array, bf: tuple[int, int]) -> mx.array:
    return x.reshape(*bf, *x.shape[1:])


def pixel_shuffle_2d(x: mx.array, p1: int, p2: int) -> mx.array:
    """(N, H, W, C*p1*p2) -> (N, H*p1, W*p2, C), channel order (c, p1, p2) as the reference."""
    n, h, w, ct = x.shape
    c = ct // (p1 * p2)
    x = x.reshape(n, h, w, c, p1, p2).transpose(0, 1, 4, 2, 5, 3)
    return x.reshape(n, h * p1, w * p2, c)


def pixel_shuffle_3d(x: mx.array, p1: int, p2: int, p3: int) -> mx.array:
    """(B, D, H, W, C*p1*p2*p3) -> (B, D*p1, H*p2, W*p3, C), channel order (c, p1, p2, p3)."""
    b, d, h, w, ct = x.shape
    c = ct // (p1 * p2 * p3)
    x = x.reshape(b, d, h, w, c, p1, p2, p3).transpose(0, 1, 5, 2, 6, 3, 7, 4)
    return x.reshape(b, d * p1, h * p2, w * p3, c)


class ResBlock(nn.Module):
    """conv -> norm -> SiLU -> conv -> norm -> SiLU(x + residual), as the reference ResBlock."""

    def __init__(self, channels: int, dims: int):
        super().__init__()
        self.conv1 = _conv(dims, channels, channels)
        self.norm1 = nn.GroupNorm(_GROUPS, channels, pytorch_compatible=True)
        self.conv2 = _conv(dims, channels, channels)
        self.norm2 = nn.GroupNorm(_GROUPS, channels, pytorch_compatible=True)

    def __call__(self, x: mx.array) -> mx.array:
        h = nn.silu(self.norm1(self.conv1(x)))
        h = self.norm2(self.conv2(h))
        return nn.silu(h + x)


class BlurDownsample(nn.Module):
    """Fixed binomial blur + stride on H, W (the x1.5 upsampler's anti-aliased downsample)."""

    def __init__(self, stride: int, kernel_size: int = 5):
        super().__init__()
        self.stride = stride
        k = np.array([math.comb(kernel_size - 1, i) for i in range(kernel_size)], dtype=np.float64)
        k2d = np.outer(k, k)
        # The checkpoint stores it (a persistent buffer); MLX layout (1, K, K, 1).
        self.kernel = mx.array((k2d / k2d.sum()).astype(np.float32)[None, :, :, None])

    def __call__(self, x: mx.array) -> mx.array:
        if self.stride == 1:
            return x
        n, h, w, c = x.shape
        k = self.kernel.shape[1]
        x = x.transpose(0, 3, 1, 2).reshape(n * c, h, w, 1)
        x = mx.conv2d(x, self.kernel.astype(x.dtype), stride=self.stride, padding=k // 2)
        return x.reshape(n, c, *x.shape[1:3]).transpose(0, 2, 3, 1)


class SpatialRationalResampler(nn.Module):
    """Up by `num` (conv + pixel shuffle), then blur-downsample by `den`, frame by frame."""

    def __init__(self, mid_channels: int, scale: float):
        super().__init__()
        if scale not in _RATIONAL:
            raise ValueError(f"unsupported spatial_scale {scale}; choose from {sorted(_RATIONAL)}")
        self.num, self.den = _RATIONAL[scale]
        self.conv = nn.Conv2d(mid_channels, self.num**2 * mid_channels, kernel_size=3, padding=1)
        self.blur_down = BlurDownsample(self.den)

    def __call__(self, x: mx.array) -> mx.array:
        x, bf = _frames_to_batch(x)
        x = self.blur_down(pixel_shuffle_2d(self.conv(x), self.num, self.num))
        return _batch_to_frames(x, bf)


class LatentUpsampler(nn.Module):
    """Upsample un-normalized VAE latents spatially and/or temporally (reference LatentUpsampler)."""

    def __init__(self, config: UpsamplerConfig):
        super().__init__()
        self.config = c = config
        if not (c.spatial_upsample or c.temporal_upsample):
            raise ValueError("either spatial_upsample or temporal_upsample must be true")
        if c.dims == 2 and (c.temporal_upsample or c.rational_resampler):
            raise ValueError("dims=2 supports only the plain spatial upsampler")
        mid = c.mid_channels
        self.initial_conv = _conv(c.dims, c.in_channels, mid)
        self.initial_norm = nn.GroupNorm(_GROUPS, mid, pytorch_compatible=True)
        self.res_blocks = [ResBlock(mid, c.dims) for _ in range(c.num_blocks_per_stage)]
        if c.spatial_upsample and c.temporal_upsample:
            self.upsampler = [nn.Conv3d(mid, 8 * mid, kernel_size=3, padding=1)]
        elif c.spatial_upsample and c.rational_resampler:
            self.upsampler = SpatialRationalResampler(mid, c.spatial_scale)
        elif c.spatial_upsample:
            self.upsampler = [nn.Conv2d(mid, 4 * mid, kernel_size=3, padding=1)]
        else:
            self.upsampler = [nn.Conv3d(mid, 2 * mid, kernel_size=3, padding=1)]
        self.post_upsample_res_blocks = [ResBlock(mid, c.dims) for _ in range(c.num_blocks_per_stage)]
        self.final_conv = _conv(c.dims, mid, c.in_channels)

    @classmethod
    def from_config(cls, cfg: dict) -> LatentUpsampler:
        return cls(UpsamplerConfig.from_config(cfg))

    def _upsample(self, x: mx.array) -> mx.array:
        c = self.config
        if isinstance(self.upsampler, SpatialRationalResampler):
            return self.upsampler(x)
        conv = self.upsampler[0]
        if c.temporal_upsample:
            # The first latent frame encodes a single pixel frame: drop its duplicate (N -> 2N - 1).
            x = conv(x)
            x = pixel_shuffle_3d(x, 2, 2, 2) if c.spatial_upsample else pixel_shuffle_3d(x, 2, 1, 1)
            return x[:, 1:]
        if x.ndim == 4:  # dims == 2: frames already folded into the batch
            return pixel_shuffle_2d(conv(x), 2, 2)
        x, bf = _frames_to_batch(x)
        return _batch_to_frames(pixel_shuffle_2d(conv(x), 2, 2), bf)

    def __call__(self, latent: mx.array) -> mx.array:
        """latent (B, C, F, H, W), un-normalized -> upsampled latent in the same layout."""
        dtype = latent.dtype
        x = latent.transpose(0, 2, 3, 4, 1).astype(self.initial_conv.weight.dtype)
        bf = None
        if self.config.dims == 2:
            x, bf = _frames_to_batch(x)
        x = nn.silu(self.initial_norm(self.initial_conv(x)))
        for block in self.res_blocks:
            x = block(x)
        x = self._upsample(x)
        for block in self.post_upsample_res_blocks:
            x = block(x)
        x = self.final_conv(x)
        if bf is not None:
            x = _batch_to_frames(x, bf)
        return x.transpose(0, 4, 1, 2, 3).astype(dtype)

    @staticmethod
    def sanitize(weights: dict) -> dict[str, mx.array]:
        """Reference state dict (torch layouts) -> our keys and channels-last conv layouts."""
        out = {}
        for key, value in weights.items():
            v = np.asarray(value) if not isinstance(value, mx.array) else value
            if v.ndim >= 3:  # conv weights and the blur kernel: (O, I, *K) -> (O, *K, I)
                v = v.transpose(0, *range(2, v.ndim), 1)
            out[key] = mx.array(v)
        return out


def upsample_latent(upsampler: LatentUpsampler, latent: mx.array, mean: mx.array, std: mx.array) -> mx.array:
    """Denormalise with the VAE's per-channel statistics, upsample, renormalise (reference upsample_video)."""
    shape = (1, -1, 1, 1, 1)
    mean = mean.astype(mx.float32).reshape(shape)
    std = std.astype(mx.float32).reshape(shape)
    x = upsampler(latent.astype(mx.float32) * std + mean)
    return ((x.astype(mx.float32) - mean) / std).astype(latent.dtype)
