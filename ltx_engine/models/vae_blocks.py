"""Building blocks of the LTX-2 video VAE, channels-last (B, F, H, W, C) as MLX convolutions want.

Attribute paths mirror the reference `ltx_core.model.video_vae` modules so the state-dict keys of a
real checkpoint (and of an mlx-forge pack) land here unchanged: `conv1.conv.weight`,
`res_blocks.0.norm3.weight`, `time_embedder.timestep_embedder.linear_1.weight`, ...
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

PIXEL_NORM_EPS = 1e-8
RESNET_EPS = 1e-6
NORM_NUM_GROUPS = 32
PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def pixel_norm(x: mx.array, eps: float = PIXEL_NORM_EPS) -> mx.array:
    """Per-location RMS norm over channels (reference PixelNorm); rms_norm accumulates in float32."""
    return mx.fast.rms_norm(x, None, eps)


def _pad_axis(x: mx.array, axis: int, pad: int, mode: str) -> mx.array:
    """Pad `pad` cells on both sides of one axis with a torch padding_mode."""
    if pad == 0:
        return x
    if mode == "zeros":
        widths = [(0, 0)] * x.ndim
        widths[axis] = (pad, pad)
        return mx.pad(x, widths)
    n = x.shape[axis]
    if mode == "reflect":
        before = list(range(pad, 0, -1))
        after = list(range(n - 2, n - 2 - pad, -1))
    elif mode == "replicate":
        before, after = [0] * pad, [n - 1] * pad
    elif mode == "circular":
        before, after = list(range(n - pad, n)), list(range(pad))
    else:
        raise ValueError(f"unknown padding mode {mode!r}")
    index = mx.array(before + list(range(n)) + after)
    return mx.take(x, index, axis=axis)


class CausalConv3d(nn.Module):
    """3D conv whose time axis is padded by repeating edge frames (first only when causal).

    Height and width are padded by kernel//2 with the configured spatial padding mode, as the
    reference `CausalConv3d` does through torch's `padding_mode`.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        stride: int | tuple[int, int, int] = 1,
        spatial_padding_mode: str = "zeros",
    ):
        super().__init__()
        if spatial_padding_mode not in PADDING_MODES:
            raise ValueError(f"unknown spatial padding mode {spatial_padding_mode!r}")
        self.time_kernel_size = kernel_size
        self.spatial_pad = kernel_size // 2
        self.spatial_padding_mode = spatial_padding_mode
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride=stride, padding=0)

    def __call__(self, x: mx.array, causal: bool = True) -> mx.array:
        k = self.time_kernel_size
        if causal:
            x = mx.concatenate([mx.repeat(x[:, :1], k - 1, axis=1), x], axis=1) if k > 1 else x
        elif k > 1:
            p = (k - 1) // 2
            x = mx.concatenate([mx.repeat(x[:, :1], p, axis=1), x, mx.repeat(x[:, -1:], p, axis=1)], axis=1)
        x = _pad_axis(x, 2, self.spatial_pad, self.spatial_padding_mode)
        x = _pad_axis(x, 3, self.spatial_pad, self.spatial_padding_mode)
        return self.conv(x)


class Conv1x1(nn.Module):
    """Pointwise 3D conv (reference `make_linear_nd`): a Conv3d with kernel 1, key `weight`/`bias`."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.weight = mx.zeros((out_channels, 1, 1, 1, in_channels))
        self.bias = mx.zeros((out_channels,))

    def __call__(self, x: mx.array) -> mx.array:
        w = self.weight.reshape(self.weight.shape[0], -1)
        return x @ w.T + self.bias


def make_norm(norm_layer: str, channels: int, eps: float = RESNET_EPS, groups: int = NORM_NUM_GROUPS):
    """Pixel norm has no weights; group norm is affine with the torch semantics."""
    if norm_layer == "group_norm":
        return nn.GroupNorm(groups, channels, eps=eps, affine=True, pytorch_compatible=True)
    if norm_layer == "pixel_norm":
        return None
    raise ValueError(f"unknown norm layer {norm_layer!r}")


def apply_norm(norm: nn.Module | None, x: mx.array) -> mx.array:
    return pixel_norm(x) if norm is None else norm(x)


def timestep_sinusoid(t: mx.array, dim: int = 256, max_period: float = 10000.0) -> mx.array:
    """Sinusoidal embedding, cos first (flip_sin_to_cos=True, downscale_freq_shift=0), in float32."""
    half = dim // 2
    freqs = mx.exp(-math.log(max_period) * mx.arange(half, dtype=mx.float32) / half)
    args = t.astype(mx.float32)[:, None] * freqs[None]
    emb = mx.concatenate([mx.cos(args), mx.sin(args)], axis=-1)
    if dim % 2:
        emb = mx.pad(emb, [(0, 0), (0, 1)])
    return emb


class TimestepEmbedding(nn.Module):
    """linear_1 -> SiLU -> linear_2 (reference `TimestepEmbedding`)."""

    def __init__(self, in_channels: int, time_embed_dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embed_dim)
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear_2(nn.silu(self.linear_1(x)))


class CombinedTimestepEmbedder(nn.Module):
    """PixArt-alpha timestep embedder (256 sinusoid channels), key `timestep_embedder.*`."""

    def __init__(self, embedding_dim: int, proj_dim: int = 256):
        super().__init__()
        self.proj_dim = proj_dim
        self.timestep_embedder = TimestepEmbedding(proj_dim, embedding_dim)

    def __call__(self, timestep: mx.array, dtype: mx.Dtype) -> mx.array:
        proj = timestep_sinusoid(timestep.reshape(-1), self.proj_dim).astype(dtype)
        return self.timestep_embedder(proj)


class ResnetBlock3D(nn.Module):
    """Pre-norm residual block: norm -> (AdaLN) -> SiLU -> conv, twice, plus a 1x1 shortcut on width change."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int | None = None,
        norm_layer: str = "pixel_norm",
        inject_noise: bool = False,
        timestep_conditioning: bool = False,
        spatial_padding_mode: str = "zeros",
    ):
        super().__init__()
        out_channels = out_channels or in_channels
        self.inject_noise = inject_noise
        self.timestep_conditioning = timestep_conditioning
        self.norm1 = make_norm(norm_layer, in_channels)
        self.conv1 = CausalConv3d(in_channels, out_channels, 3, spatial_padding_mode=spatial_padding_mode)
        self.norm2 = make_norm(norm_layer, out_channels)
        self.conv2 = CausalConv3d(out_channels, out_channels, 3, spatial_padding_mode=spatial_padding_mode)
        if inject_noise:
            self.per_channel_scale1 = mx.zeros((in_channels, 1, 1))
            self.per_channel_scale2 = mx.zeros((in_channels, 1, 1))
        if in_channels != out_channels:
            self.conv_shortcut = Conv1x1(in_channels, out_channels)
            self.norm3 = nn.GroupNorm(1, in_channels, eps=RESNET_EPS, affine=True, pytorch_compatible=True)
        if timestep_conditioning:
            self.scale_shift_table = mx.zeros((4, in_channels))

    @staticmethod
    def _spatial_noise(x: mx.array, scale: mx.array, key: mx.array | None) -> mx.array:
        """StyleGAN-style noise: one (H, W) field shared by batch and frames, scaled per channel."""
        noise = mx.random.normal(x.shape[2:4], key=key).astype(x.dtype)
        return x + noise[:, :, None] * scale.reshape(-1).astype(x.dtype)

    def __call__(
        self,
        x: mx.array,
        causal: bool = True,
        timestep: mx.array | None = None,
        key: mx.array | None = None,
    ) -> mx.array:
        h = apply_norm(self.norm1, x)
        if self.timestep_conditioning:
            if timestep is None:
                raise ValueError("timestep is required when timestep_conditioning is on")
            ada = self.scale_shift_table.astype(h.dtype)[None] + timestep.reshape(x.shape[0], 4, -1)
            shift1, scale1, shift2, scale2 = (ada[:, i, None, None, None, :] for i in range(4))
            h = h * (1 + scale1) + shift1
        h = self.conv1(nn.silu(h), causal=causal)
        keys = mx.random.split(key) if (self.inject_noise and key is not None) else (None, None)
        if self.inject_noise:
            h = self._spatial_noise(h, self.per_channel_scale1, keys[0])
        h = apply_norm(self.norm2, h)
        if self.timestep_conditioning:
            h = h * (1 + scale2) + shift2
        h = self.conv2(nn.silu(h), causal=causal)
        if self.inject_noise:
            h = self._spatial_noise(h, self.per_channel_scale2, keys[1])
        if "conv_shortcut" in self:
            x = self.conv_shortcut(self.norm3(x))
        return x + h


class UNetMidBlock3D(nn.Module):
    """A stack of same-width residual blocks sharing one timestep embedding (`res_x`)."""

    def __init__(
        self,
        in_channels: int,
        num_layers: int,
        norm_layer: str = "pixel_norm",
        inject_noise: bool = False,
        timestep_conditioning: bool = False,
        spatial_padding_mode: str = "zeros",
    ):
        super().__init__()
        self.timestep_conditioning = timestep_conditioning
        if timestep_conditioning:
            self.time_embedder = CombinedTimestepEmbedder(in_channels * 4)
        self.res_blocks = [
            ResnetBlock3D(
                in_channels,
                in_channels,
                norm_layer=norm_layer,
                inject_noise=inject_noise,
                timestep_conditioning=timestep_conditioning,
                spatial_padding_mode=spatial_padding_mode,
            )
            for _ in range(num_layers)
        ]

    def __call__(
        self,
        x: mx.array,
        causal: bool = True,
        timestep: mx.array | None = None,
        key: mx.array | None = None,
    ) -> mx.array:
        emb = None
        if self.timestep_conditioning:
            if timestep is None:
                raise ValueError("timestep is required when timestep_conditioning is on")
            emb = self.time_embedder(timestep, x.dtype)
        keys = (
            mx.random.split(key, len(self.res_blocks)) if key is not None else [None] * len(self.res_blocks)
        )
        for block, k in zip(self.res_blocks, keys, strict=True):
            x = block(x, causal=causal, timestep=emb, key=k)
        return x


def depth_to_space(x: mx.array, stride: tuple[int, int, int]) -> mx.array:
    """(B, D, H, W, c*p1*p2*p3) -> (B, D*p1, H*p2, W*p3, c), channel order (c, p1, p2, p3) as the reference."""
    b, d, h, w, ch = x.shape
    p1, p2, p3 = stride
    c = ch // (p1 * p2 * p3)
    x = x.reshape(b, d, h, w, c, p1, p2, p3).transpose(0, 1, 5, 2, 6, 3, 7, 4)
    return x.reshape(b, d * p1, h * p2, w * p3, c)


def space_to_depth(x: mx.array, stride: tuple[int, int, int]) -> mx.array:
    """Inverse of `depth_to_space`."""
    b, d, h, w, c = x.shape
    p1, p2, p3 = stride
    x = x.reshape(b, d // p1, p1, h // p2, p2, w // p3, p3, c).transpose(0, 1, 3, 5, 7, 2, 4, 6)
    return x.reshape(b, d // p1, h // p2, w // p3, c * p1 * p2 * p3)


class DepthToSpaceUpsample(nn.Module):
    """Conv to prod(stride)x channels then pixel-shuffle; a doubled time axis drops its first frame."""

    def __init__(
        self,
        in_channels: int,
        stride: tuple[int, int, int],
        residual: bool = False,
        out_channels_reduction_factor: int = 1,
        spatial_padding_mode: str = "zeros",
    ):
        super().__init__()
        self.stride = tuple(stride)
        self.residual = residual
        self.reduction = out_channels_reduction_factor
        out_channels = math.prod(stride) * in_channels // out_channels_reduction_factor
        self.conv = CausalConv3d(in_channels, out_channels, 3, spatial_padding_mode=spatial_padding_mode)

    def __call__(self, x: mx.array, causal: bool = True) -> mx.array:
        if self.residual:
            x_in = depth_to_space(x, self.stride)
            x_in = mx.tile(x_in, (1, 1, 1, 1, math.prod(self.stride) // self.reduction))
            if self.stride[0] == 2:
                x_in = x_in[:, 1:]
        x = depth_to_space(self.conv(x, causal=causal), self.stride)
        if self.stride[0] == 2:
            x = x[:, 1:]
        return x + x_in if self.residual else x


class SpaceToDepthDownsample(nn.Module):
    """Conv then space-to-depth, plus a grouped channel mean of the space-to-depth input as skip."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        stride: tuple[int, int, int],
        spatial_padding_mode: str = "zeros",
    ):
        super().__init__()
        self.stride = tuple(stride)
        self.group_size = in_channels * math.prod(stride) // out_channels
        self.conv = CausalConv3d(
            in_channels, out_channels // math.prod(stride), 3, spatial_padding_mode=spatial_padding_mode
        )

    def __call__(self, x: mx.array, causal: bool = True) -> mx.array:
        if self.stride[0] == 2:
            x = mx.concatenate([x[:, :1], x], axis=1)
        skip = space_to_depth(x, self.stride)
        skip = skip.reshape(*skip.shape[:-1], -1, self.group_size).mean(axis=-1)
        return space_to_depth(self.conv(x, causal=causal), self.stride) + skip


def patchify(x: mx.array, patch: int) -> mx.array:
    """(B, F, H, W, C) -> (B, F, H/p, W/p, C*p*p), channel order (c, w-offset, h-offset) as the reference."""
    if patch == 1:
        return x
    b, f, h, w, c = x.shape
    x = x.reshape(b, f, h // patch, patch, w // patch, patch, c).transpose(0, 1, 2, 4, 6, 5, 3)
    return x.reshape(b, f, h // patch, w // patch, c * patch * patch)


def unpatchify(x: mx.array, patch: int) -> mx.array:
    """Inverse of `patchify`."""
    if patch == 1:
        return x
    b, f, h, w, ch = x.shape
    c = ch // (patch * patch)
    x = x.reshape(b, f, h, w, c, patch, patch).transpose(0, 1, 2, 6, 3, 5, 4)
    return x.reshape(b, f, h * patch, w * patch, c)


class PerChannelStatistics(nn.Module):
    """Dataset statistics of the latent channels; keys `mean`/`std` (pack renames handled by the VAE)."""

    def __init__(self, latent_channels: int):
        super().__init__()
        self.mean = mx.zeros((latent_channels,))
        self.std = mx.ones((latent_channels,))

    def normalize(self, x: mx.array) -> mx.array:
        return (x - self.mean.astype(x.dtype)) / self.std.astype(x.dtype)

    def un_normalize(self, x: mx.array) -> mx.array:
        return x * self.std.astype(x.dtype) + self.mean.astype(x.dtype)
