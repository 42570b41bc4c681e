"""Lanczos x2 of an 8-bit RGB frame, as Pillow's `Image.resize(..., LANCZOS)` computes it. Pure numpy.

DFR's spatial epilogue stretches every carried keyframe 2x in RGB (upstream `lanczos_x2_fhwc`: the
decoded frame rounded to uint8, PIL Lanczos, / 255). Pillow is not a dependency here, so its separable
8-bit resampler is written out: Lanczos-3 weights per output pixel (support 3 when enlarging, centre
(i + 0.5) * in / out), normalised, turned into 22-bit fixed point (`normalize_coeffs_8bpc`), the
horizontal pass first, each pass rounded and clipped to uint8 (`ImagingResample`).
"""

from __future__ import annotations

import numpy as np

PRECISION_BITS = 32 - 8 - 2
SUPPORT = 3.0


def lanczos_weight(x: np.ndarray) -> np.ndarray:
    """sinc(x) * sinc(x / 3) on [-3, 3), 0 outside (Pillow's `lanczos_filter`)."""
    x = np.asarray(x, np.float64)
    inside = (x > -SUPPORT) & (x < SUPPORT)
    return np.where(inside, np.sinc(x) * np.sinc(x / SUPPORT), 0.0)


def fixed_point_coefficients(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(first input index, (out_size, taps) int64 weights) of an enlarging Lanczos pass."""
    if out_size < in_size:
        raise ValueError("only enlarging passes are written here")
    scale = in_size / out_size
    taps = int(np.ceil(SUPPORT)) * 2 + 1
    starts = np.zeros(out_size, np.int64)
    weights = np.zeros((out_size, taps), np.int64)
    for i in range(out_size):
        centre = (i + 0.5) * scale
        lo, hi = max(int(centre - SUPPORT + 0.5), 0), min(int(centre + SUPPORT + 0.5), in_size)
        k = lanczos_weight(np.arange(lo, hi) - centre + 0.5)
        total = k.sum()
        k = k / total if total != 0 else k
        fixed = np.where(k < 0, -0.5 + k * (1 << PRECISION_BITS), 0.5 + k * (1 << PRECISION_BITS))
        starts[i], weights[i, : hi - lo] = lo, fixed.astype(np.int64)
    return starts, weights


def _pass(image: np.ndarray, out_size: int, axis: int) -> np.ndarray:
    """One 8-bit pass along `axis` (0 rows, 1 columns) of an (H, W, C) uint8 image."""
    moved = np.moveaxis(image.astype(np.int64), axis, 0)
    starts, weights = fixed_point_coefficients(moved.shape[0], out_size)
    padded = np.concatenate([moved, np.zeros((weights.shape[1], *moved.shape[1:]), np.int64)])
    index = starts[:, None] + np.arange(weights.shape[1])[None, :]
    acc = np.einsum("ot,ot...->o...", weights, padded[index]) + (1 << (PRECISION_BITS - 1))
    out = np.clip(acc >> PRECISION_BITS, 0, 255).astype(np.uint8)
    return np.moveaxis(out, 0, axis)


def lanczos_x2(frame: np.ndarray) -> np.ndarray:
    """(H, W, C) uint8 → (2H, 2W, C) uint8: the horizontal pass, then the vertical, as Pillow does."""
    if frame.ndim != 3 or frame.dtype != np.uint8:
        raise ValueError(f"expected an (H, W, C) uint8 frame, got {frame.dtype} {frame.shape}")
    wide = _pass(frame, 2 * frame.shape[1], 1)
    return _pass(wide, 2 * frame.shape[0], 0)


def to_uint8(frame: np.ndarray) -> np.ndarray:
    """A decoded [0, 1] float frame as upstream hands it to PIL: clamp, * 255, round, uint8."""
    return np.round(np.clip(np.asarray(frame, np.float32), 0.0, 1.0) * np.float32(255.0)).astype(np.uint8)
