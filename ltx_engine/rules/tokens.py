"""Latents as token sequences (patch size 1): the one implementation of the layouts, in numpy.

The sampler state, the tiler and the coordinator all use these, and the pure math must not need
MLX (the coordinator imports it).
"""

from __future__ import annotations

import numpy as np


def patchify_video(latent: np.ndarray) -> np.ndarray:
    """(B, C, F, H, W) → (B, F*H*W, C), token index f*H*W + h*W + w."""
    b, c = latent.shape[:2]
    return np.ascontiguousarray(latent.reshape(b, c, -1).transpose(0, 2, 1))


def unpatchify_video(tokens: np.ndarray, grid: tuple[int, int, int]) -> np.ndarray:
    b, _, c = tokens.shape
    return np.ascontiguousarray(tokens.transpose(0, 2, 1).reshape(b, c, *grid))


def slot_latent(tokens: np.ndarray, slot_range: tuple[int, int], grid: tuple[int, int, int]) -> np.ndarray:
    """A stage's generated keyframe slots (1, C, K, h, w) out of its token range [start, end) of a state
    on `grid` (one latent frame of tokens per slot)."""
    start, end = (int(n) for n in slot_range)
    return unpatchify_video(tokens[:, start:end], ((end - start) // (grid[1] * grid[2]), *grid[1:]))


def patchify_audio(latent: np.ndarray) -> np.ndarray:
    """(B, C, T, M) → (B, T, C*M) (channels slowest, mel fastest, as the reference)."""
    b, c, t, m = latent.shape
    return np.ascontiguousarray(latent.transpose(0, 2, 1, 3).reshape(b, t, c * m))


def unpatchify_audio(tokens: np.ndarray, channels: int) -> np.ndarray:
    b, t, cm = tokens.shape
    return np.ascontiguousarray(tokens.reshape(b, t, channels, cm // channels).transpose(0, 2, 1, 3))
