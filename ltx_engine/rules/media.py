"""Pixels in and out of the engine: images to the VAE's input range, nothing model-specific."""

from __future__ import annotations

import numpy as np


def _resize_axis(image: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Linear resampling along one axis with pixel-centre alignment (area-averaging when shrinking)."""
    n = image.shape[axis]
    if n == size:
        return image
    if size < n:  # box filter first so shrinking does not alias
        edges = np.linspace(0, n, size + 1)
        cumsum = np.cumsum(np.insert(image, 0, 0, axis=axis), axis=axis, dtype=np.float64)
        lo, hi = np.floor(edges[:-1]).astype(int), np.ceil(edges[1:]).astype(int)
        sums = np.take(cumsum, hi, axis=axis) - np.take(cumsum, lo, axis=axis)
        shape = [1] * image.ndim
        shape[axis] = size
        return (sums / (hi - lo).reshape(shape)).astype(np.float32)
    coords = (np.arange(size) + 0.5) * n / size - 0.5
    lo = np.clip(np.floor(coords).astype(int), 0, n - 1)
    hi = np.clip(lo + 1, 0, n - 1)
    frac = (coords - lo).astype(np.float32)
    shape = [1] * image.ndim
    shape[axis] = size
    frac = frac.reshape(shape)
    return np.take(image, lo, axis=axis) * (1 - frac) + np.take(image, hi, axis=axis) * frac


def resize_center_crop(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Scale to cover (height, width) keeping the aspect ratio, then crop the centre. float32 out."""
    img = np.asarray(image, dtype=np.float32)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=2)
    img = img[..., :3]
    scale = max(height / img.shape[0], width / img.shape[1])
    new_h, new_w = max(height, round(img.shape[0] * scale)), max(width, round(img.shape[1] * scale))
    img = _resize_axis(_resize_axis(img, new_h, 0), new_w, 1)
    top, left = (new_h - height) // 2, (new_w - width) // 2
    return img[top : top + height, left : left + width]


def image_to_pixels(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 RGB (H, W, 3) → (1, 3, 1, height, width) float32 in [-1, 1], the VAE encoder's input."""
    img = resize_center_crop(image, height, width) / 255.0 * 2.0 - 1.0
    return np.ascontiguousarray(img.transpose(2, 0, 1)[None, :, None].astype(np.float32))
