"""Rotary position embeddings of the LTX-2 DiT (fractional positions, SPLIT and INTERLEAVED layouts).

Positions are `[start, end)` intervals per axis (pixels for H/W, seconds for time). Angles reach
~1.5e4 rad, so positions and the angle grid stay float32 whatever the weight dtype; only the
resulting cos/sin are cast to the compute dtype, as the reference does.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

SPLIT = "split"
INTERLEAVED = "interleaved"


def parse_rope_type(value: str) -> str:
    """Accept the reference's enum values in any case ("split", "SPLIT", "interleaved")."""
    v = str(value).lower()
    if v not in (SPLIT, INTERLEAVED):
        raise ValueError(f"unknown rope type {value!r}")
    return v


@functools.lru_cache(maxsize=16)
def _freq_grid(theta: float, n_axes: int, dim: int, double_precision: bool) -> np.ndarray:
    """Per-axis frequencies `theta**linspace(0, 1, dim // (2*n_axes)) * pi/2` as float32.

    The float64 variant is the reference's numpy grid; the float32 one reproduces torch's
    float32 linspace (filled from both ends) and float32 pow.
    """
    n = dim // (2 * n_axes)
    start, end = math.log(1.0, theta), math.log(theta, theta)
    if double_precision:
        grid = np.power(theta, np.linspace(start, end, n, dtype=np.float64))
        return (grid * math.pi / 2).astype(np.float32)
    # torch's float32 linspace: float32 step, each half filled from its end with one rounding (FMA).
    i = np.arange(n, dtype=np.float64)
    step = np.float64(np.float32(end - start) / np.float32(max(n - 1, 1)))
    lin = np.where(i < n // 2, start + step * i, end - step * (n - 1 - i)).astype(np.float32)
    grid = np.power(np.float64(theta), lin.astype(np.float64)).astype(np.float32)
    return (grid * np.float32(math.pi)) / np.float32(2)


@dataclass
class RopeTable:
    """cos/sin ready for `apply_rope`: SPLIT (B, H, T, Dh/2); INTERLEAVED (B, T, inner)."""

    cos: mx.array
    sin: mx.array
    kind: str


def _angles(positions: mx.array, grid: mx.array, max_pos: list[int], use_middle: bool) -> mx.array:
    """(B, T, F * n_axes) angles, frequency-major / axis-minor like the reference's flatten."""
    pos = positions.astype(mx.float32)
    if use_middle:
        pos = (pos[..., 0] + pos[..., 1]) / 2.0
    elif pos.ndim == 4:
        pos = pos[..., 0]
    n_axes = pos.shape[1]
    frac = mx.stack([pos[:, i] / max_pos[i] for i in range(n_axes)], axis=-1)  # (B, T, n_axes)
    freqs = grid * (frac[..., None] * 2 - 1)  # (B, T, n_axes, F)
    freqs = freqs.swapaxes(-1, -2)  # (B, T, F, n_axes)
    return freqs.reshape(freqs.shape[0], freqs.shape[1], -1)


def rope_table(
    positions: mx.array,
    *,
    dim: int,
    heads: int,
    theta: float,
    max_pos: list[int],
    use_middle_indices_grid: bool,
    rope_type: str,
    double_precision: bool,
    dtype: mx.Dtype,
) -> RopeTable:
    """cos/sin for `positions` (B, n_axes, T, 2) over an attention of `heads` heads and `dim` total width."""
    n_axes = positions.shape[1]
    grid = mx.array(_freq_grid(float(theta), n_axes, dim, bool(double_precision)))
    freqs = _angles(positions, grid, max_pos, use_middle_indices_grid)
    cos, sin = mx.cos(freqs), mx.sin(freqs)
    b, t = freqs.shape[0], freqs.shape[1]
    if rope_type == SPLIT:
        pad = dim // 2 - freqs.shape[-1]
        if pad:
            cos = mx.concatenate([mx.ones((b, t, pad), cos.dtype), cos], axis=-1)
            sin = mx.concatenate([mx.zeros((b, t, pad), sin.dtype), sin], axis=-1)
        cos = cos.reshape(b, t, heads, -1).swapaxes(1, 2)
        sin = sin.reshape(b, t, heads, -1).swapaxes(1, 2)
    else:
        cos = mx.repeat(cos, 2, axis=-1)
        sin = mx.repeat(sin, 2, axis=-1)
        pad = dim % (2 * n_axes)
        if pad:
            cos = mx.concatenate([mx.ones((b, t, pad), cos.dtype), cos], axis=-1)
            sin = mx.concatenate([mx.zeros((b, t, pad), sin.dtype), sin], axis=-1)
    return RopeTable(cos.astype(dtype), sin.astype(dtype), rope_type)


def apply_interleaved(x: mx.array, table: RopeTable) -> mx.array:
    """Rotate pairs (x[2i], x[2i+1]) of a flat (B, T, inner) tensor."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    rot = mx.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)
    return x * table.cos + rot * table.sin


def apply_split(x: mx.array, table: RopeTable) -> mx.array:
    """Rotate halves of each head of a (B, H, T, Dh) tensor."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = table.cos, table.sin
    return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def apply_split_flat(x: mx.array, table: RopeTable) -> mx.array:
    """SPLIT-rotate flat (B, T, inner) features cut into the table's own head count (B, H', T, inner/H')."""
    b, t, inner = x.shape
    heads = table.cos.shape[1]
    xh = x.reshape(b, t, heads, inner // heads).swapaxes(1, 2)
    return apply_split(xh, table).swapaxes(1, 2).reshape(b, t, inner)
