"""Neighbourhood-attention blocks of LTX-2.5's diffusion video decoder (`vae_decoder_av`), in MLX.

ltx-core 1.0.0 has no diffusion decoder; this follows upstream's `ltx_core.model.video_vae.transformer`
(after 1.2.0): 3D neighbourhood attention with NATTEN's window rule (a window of `min(k, L)` cells
that shifts inward at the borders, never clamp-and-mask), absolute interleaved RoPE over (T, H, W)
with local 0-based positions, Q/K RMS norms, SwiGLU MLPs without biases, AdaLN-Zero modulation
(legacy gates already folded into the Linear weights by the pack), and a Linear + pixel-shuffle
upsampler that drops the duplicate leading frame of a 2x time hop. Tensors are channels-last
(B, T, H, W, C) as upstream's.

Attention gathers each query's window by index, rows of a frame of queries at a time, so the working
set is at most GATHER_BUDGET gathered elements (upstream runs NATTEN's fused kernels instead).
"""

from __future__ import annotations

import functools
import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

ADALN_CHUNKS = 7  # scale_msa, shift_msa, gate_msa, scale_mlp, shift_mlp, gate_mlp, gate_ctx
SCALE_MSA, SHIFT_MSA, SCALE_MLP, SHIFT_MLP = 0, 1, 3, 4
TIME_PROJ_DIM = 256
GATHER_BUDGET = 2**26  # gathered K (or V) elements per chunk: 256 MB in float32


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Upstream's default split of a head across (T, H, W) RoPE chunks (each even)."""
    d_t = (head_dim // 4) // 2 * 2
    d_hw = (head_dim - d_t) // 2
    if d_hw % 2:
        d_t -= 2
        d_hw = (head_dim - d_t) // 2
    if d_t <= 0 or d_hw <= 0:
        raise ValueError(f"head_dim {head_dim} has no RoPE split (needs a multiple of 8 from 16)")
    return d_t, d_hw, d_hw


def _inv_freqs(dim: int, base: float = 10000.0) -> mx.array:
    return mx.array((1.0 / np.power(base, np.arange(0, dim, 2, dtype=np.float64) / dim)).astype(np.float32))


def _rotate_axis(x: mx.array, positions: mx.array, dim: int, axis: int) -> mx.array:
    """Absolute RoPE on one chunk x[..., dim] (interleaved pairs) along `axis` of (B, T, H, W, NH, D)."""
    ang = positions.astype(mx.float32)[:, None] * _inv_freqs(dim)[None, :]
    shape = [1, 1, 1, 1, 1, dim // 2]
    shape[axis] = positions.shape[0]
    cos, sin = mx.cos(ang).reshape(shape), mx.sin(ang).reshape(shape)
    pairs = x.reshape(*x.shape[:-1], dim // 2, 2)
    xe, xo = pairs[..., 0], pairs[..., 1]
    return mx.stack([xe * cos - xo * sin, xe * sin + xo * cos], axis=-1).reshape(x.shape)


def apply_rope(x: mx.array, split: tuple[int, int, int], t_pos: mx.array | None = None) -> mx.array:
    """(B, T, H, W, NH, D): the first d_t channels rotate with T, the next d_h with H, the rest with W.
    `t_pos` (default 0..T-1) are fractional times where the T axis holds keyframe planes."""
    d_t, d_h, d_w = split
    _, t, h, w = x.shape[:4]
    t_pos = mx.arange(t, dtype=mx.float32) if t_pos is None else t_pos
    return mx.concatenate(
        [
            _rotate_axis(x[..., :d_t], t_pos, d_t, 1),
            _rotate_axis(x[..., d_t : d_t + d_h], mx.arange(h, dtype=mx.float32), d_h, 2),
            _rotate_axis(x[..., d_t + d_h :], mx.arange(w, dtype=mx.float32), d_w, 3),
        ],
        axis=-1,
    )


def window_starts(length: int, kernel: int) -> tuple[np.ndarray, int]:
    """NATTEN's non-causal window along one axis: per index its start, and the window length."""
    k = min(kernel, length)
    idx = np.arange(length)
    return np.clip(idx - k // 2, 0, length - k), k


@functools.lru_cache(maxsize=32)
def _plane_index(h: int, w: int, kh: int, kw: int) -> mx.array:
    """Flat (H*W) indices of every query's spatial window: (H, W, kh'*kw'), the same for every frame."""
    (sh, kh), (sw, kw) = window_starts(h, kh), window_starts(w, kw)
    hh = (sh[:, None] + np.arange(kh))[:, None, :, None]
    ww = (sw[:, None] + np.arange(kw))[None, :, None, :]
    return mx.array((hh * w + ww).reshape(h, w, kh * kw).astype(np.int32))


def na3d(q: mx.array, k: mx.array, v: mx.array, kernel: tuple[int, int, int]) -> mx.array:
    """Neighbourhood attention over (B, T, H, W, NH, D) with Q already scaled; out (B, T, H, W, NH, D)."""
    b, t, h, w, nh, d = q.shape
    kf, vf = k.reshape(b, t * h * w, nh, d), v.reshape(b, t * h * w, nh, d)
    starts, kt = window_starts(t, kernel[0])
    plane = _plane_index(h, w, kernel[1], kernel[2])
    rows = max(1, GATHER_BUDGET // max(1, b * w * kt * plane.shape[-1] * nh * d))
    out = []
    for t0 in range(t):  # a frame of queries at a time (rows of it at full size) bounds the gathered K/V
        frames = mx.array(((starts[t0] + np.arange(kt)) * h * w).astype(np.int32))
        idx = (frames[None, None, :, None] + plane[:, :, None, :]).reshape(1, h, w, -1)  # (t, h, w) flat
        parts = []
        for h0 in range(0, h, rows):
            kg, vg = kf[:, idx[:, h0 : h0 + rows]], vf[:, idx[:, h0 : h0 + rows]]  # (B, 1, rows, W, K, NH, D)
            scores = mx.sum(q[:, t0 : t0 + 1, h0 : h0 + rows, :, None] * kg, axis=-1)
            weights = mx.softmax(scores, axis=4, precise=True)
            parts.append(mx.sum(weights[..., None] * vg, axis=4))
        out.append(parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2))
    return mx.concatenate(out, axis=1)


class NeighbourhoodAttention3D(nn.Module):
    """Fused `qkv` (the pack's layout), per-head Q/K RMS norms, absolute RoPE, NA, out `proj`."""

    def __init__(self, dim: int, kernel: tuple[int, int, int], head_dim: int):
        super().__init__()
        self.heads, self.head_dim, self.kernel = dim // head_dim, head_dim, tuple(kernel)
        self.split = rope_split(head_dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.q_norm = nn.RMSNorm(head_dim, eps=1e-6)
        self.k_norm = nn.RMSNorm(head_dim, eps=1e-6)

    def __call__(self, x: mx.array) -> mx.array:
        b, t, h, w, c = x.shape
        q, k, v = (
            y.reshape(b, t, h, w, self.heads, self.head_dim) for y in mx.split(self.qkv(x), 3, axis=-1)
        )
        q = apply_rope(self.q_norm(q) * (self.head_dim**-0.5), self.split)
        k = apply_rope(self.k_norm(k), self.split)
        return self.proj(na3d(q, k, v, self.kernel).reshape(b, t, h, w, c))


class SwiGLU(nn.Module):
    """`w_down(silu(w_gate(x)) * w_up(x))`, no biases; hidden = 4 * dim rounded up to 16."""

    def __init__(self, dim: int, mlp_ratio: float = 4.0):
        super().__init__()
        hidden = (int(dim * mlp_ratio) + 15) // 16 * 16
        self.w_up = nn.Linear(dim, hidden, bias=False)
        self.w_gate = nn.Linear(dim, hidden, bias=False)
        self.w_down = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.w_down(nn.silu(self.w_gate(x)) * self.w_up(x))


class NABlock(nn.Module):
    """A deterministic stage's block: x + NA(norm1 x), then x + MLP(norm2 x)."""

    def __init__(self, dim: int, kernel: tuple[int, int, int], head_dim: int):
        super().__init__()
        self.norm1 = nn.RMSNorm(dim, eps=1e-6)
        self.attn = NeighbourhoodAttention3D(dim, kernel, head_dim)
        self.norm2 = nn.RMSNorm(dim, eps=1e-6)
        self.mlp = SwiGLU(dim)

    def __call__(self, x: mx.array) -> mx.array:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class DiffusionNABlock(nn.Module):
    """A stage-5 block: the context projected into x, then AdaLN-modulated NA and MLP residuals (ungated:
    the gates are folded into `attn.proj`, `mlp.w_down` and `context_proj`)."""

    def __init__(self, dim: int, kernel: tuple[int, int, int], context_channels: int, head_dim: int):
        super().__init__()
        self.context_proj = nn.Linear(context_channels, dim)
        self.scale_shift_table = mx.zeros((ADALN_CHUNKS, dim))
        self.norm1 = nn.RMSNorm(dim, eps=1e-6)
        self.attn = NeighbourhoodAttention3D(dim, kernel, head_dim)
        self.norm2 = nn.RMSNorm(dim, eps=1e-6)
        self.mlp = SwiGLU(dim)

    def __call__(self, x: mx.array, context: mx.array, modulation: mx.array) -> mx.array:
        """x (B, T, H, W, C5), context (B, T, H, W, Cctx), modulation (B, 7, C5) -> x."""
        mod = modulation + self.scale_shift_table[None]
        row = [mod[:, i][:, None, None, None, :] for i in range(ADALN_CHUNKS)]
        x = x + self.context_proj(context)
        x = x + self.attn(self.norm1(x) * (1.0 + row[SCALE_MSA]) + row[SHIFT_MSA])
        return x + self.mlp(self.norm2(x) * (1.0 + row[SCALE_MLP]) + row[SHIFT_MLP])


class PixelShuffleUpsample(nn.Module):
    """Linear channel expand, then channels-last pixel shuffle `(c p1 p2 p3)` -> (t p1, h p2, w p3)."""

    def __init__(self, channels: int, stride: tuple[int, int, int], reduction: int):
        super().__init__()
        self.stride = tuple(stride)
        self.out_channels = channels // reduction
        self.proj = nn.Linear(channels, math.prod(stride) * self.out_channels)

    def __call__(self, x: mx.array, drop_leading_frame: bool = True) -> mx.array:
        b, t, h, w, _ = x.shape
        p1, p2, p3 = self.stride
        x = self.proj(x).reshape(b, t, h, w, self.out_channels, p1, p2, p3)
        x = x.transpose(0, 1, 5, 2, 6, 3, 7, 4).reshape(b, t * p1, h * p2, w * p3, self.out_channels)
        return x[:, 1:] if p1 == 2 and drop_leading_frame else x


class TimestepEmbedder(nn.Module):
    """PixArt-alpha's timestep embedding: 256 sinusoids (cos first), Linear-SiLU-Linear (`mlp.0`, `mlp.2`)."""

    def __init__(self, dim: int):
        super().__init__()
        self.mlp = [nn.Linear(TIME_PROJ_DIM, dim), nn.SiLU(), nn.Linear(dim, dim)]

    def __call__(self, t: mx.array) -> mx.array:
        half = TIME_PROJ_DIM // 2
        freqs = mx.exp(-math.log(10000.0) * mx.arange(half, dtype=mx.float32) / half)
        args = t.astype(mx.float32)[:, None] * freqs[None]
        emb = mx.concatenate([mx.cos(args), mx.sin(args)], axis=-1)
        for layer in self.mlp:
            emb = layer(emb)
        return emb
