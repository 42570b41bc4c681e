"""Tiled video VAE encode: pixel tile plan, latent placement masks, and the weighted blend.

Pure numpy, the decode's counterpart (`decode_tiling.py`). The layout follows the reference
(ltx-core `prepare_tiles_for_encoding` / `VideoEncoder.tiled_encode`): pixel tiles with symmetric
overlaps in space; in time the same split with every tile but the last one frame longer (so each
holds 1 + 8k frames) and no right ramp. Each tile's latent lands in its latent slice under a 0/1
mask that drops the latents its cut edge spoiled; the result is sum(latent * mask) / max(sum(mask),
1e-8), accumulated in float32 in tile order, so a farm that encodes tiles anywhere blends the same.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

F32 = np.float32
TIME_FACTOR = 8
SPACE_FACTOR = 32
MIN_SPATIAL_OVERLAP = 64  # the reference raises smaller overlaps to these (with a warning)
MIN_TEMPORAL_OVERLAP = 16


@dataclass(frozen=True)
class EncodeTileSizes:
    """Tile sizes in pixels; None leaves that axis whole (the reference's absent spatial/temporal config)."""

    frames: int | None = 64
    frames_overlap: int = 24
    spatial: int | None = 512
    spatial_overlap: int = 64

    def __post_init__(self) -> None:
        if self.frames is not None:
            _check("temporal", self.frames, self.frames_overlap, TIME_FACTOR, 16)
            if max(self.frames_overlap, MIN_TEMPORAL_OVERLAP) >= self.frames:
                raise ValueError(f"temporal tile {self.frames} needs more than {MIN_TEMPORAL_OVERLAP} frames")
        if self.spatial is not None:
            _check("spatial", self.spatial, self.spatial_overlap, SPACE_FACTOR, 64)
            if max(self.spatial_overlap, MIN_SPATIAL_OVERLAP) >= self.spatial:
                raise ValueError(f"spatial tile {self.spatial} needs more than {MIN_SPATIAL_OVERLAP} pixels")


def _check(name: str, size: int, overlap: int, factor: int, minimum: int) -> None:
    if size < minimum or size % factor or overlap % factor or not 0 <= overlap < size:
        raise ValueError(f"{name} encode tile {size} / overlap {overlap}: size >= {minimum}, both multiples "
                         f"of {factor}, overlap below size")


@dataclass(frozen=True)
class Span:
    """One tile along one axis: pixel [start, end), its ramps in pixels."""

    start: int
    end: int
    left: int
    right: int


@dataclass(frozen=True)
class EncodeTile:
    """Pixel slices (t, h, w) to encode, the latent slices they land in, and the 1-D 0/1 masks."""

    pixels: tuple[slice, slice, slice]
    latents: tuple[slice, slice, slice]
    masks: tuple[np.ndarray, np.ndarray, np.ndarray]

    @property
    def mask(self) -> np.ndarray:
        """(t, h, w) separable mask."""
        t, h, w = self.masks
        return t[:, None, None] * h[None, :, None] * w[None, None, :]


def symmetric_split(length: int, size: int, overlap: int) -> list[Span]:
    if length <= size:
        return [Span(0, length, 0, 0)]
    count = (length + size - 2 * overlap - 1) // (size - overlap)
    starts = [i * (size - overlap) for i in range(count)]
    ends = [s + size for s in starts[:-1]] + [length]
    return [Span(s, e, 0 if i == 0 else overlap, overlap if i < count - 1 else 0)
            for i, (s, e) in enumerate(zip(starts, ends, strict=True))]


def temporal_split(frames: int, size: int, overlap: int) -> list[Span]:
    """The spatial split in frames, each tile but the last one frame longer, no right ramps."""
    spans = symmetric_split(frames, size, overlap)
    if len(spans) == 1:
        return spans
    last = len(spans) - 1
    return [Span(s.start, s.end + (i < last), s.left, 0) for i, s in enumerate(spans)]


def _rect(length: int, left: int, right: int) -> np.ndarray:
    mask = np.ones(length, F32)
    if left > 0:
        mask[:left] = 0
    if right > 0:
        mask[-right:] = 0
    return mask


def temporal_to_latent(span: Span) -> tuple[slice, np.ndarray]:
    start, stop = span.start // TIME_FACTOR, (span.end - 1) // TIME_FACTOR + 1
    left = 0 if span.left == 0 else 1 + (span.left - 1) // TIME_FACTOR
    return slice(start, stop), _rect(stop - start, left, 0)


def spatial_to_latent(span: Span) -> tuple[slice, np.ndarray]:
    start, stop = span.start // SPACE_FACTOR, span.end // SPACE_FACTOR
    left = max(0, span.left // SPACE_FACTOR - 1)
    return slice(start, stop), _rect(stop - start, left, 0 if span.right == 0 else 1)


def _axis(length: int, size: int | None, overlap: int, temporal: bool) -> list[tuple[slice, slice, np.ndarray]]:
    """(pixel slice, latent slice, mask) per tile along one axis; an untiled axis is one whole tile."""
    if size is None:
        latent = (length - 1) // TIME_FACTOR + 1 if temporal else length // SPACE_FACTOR
        return [(slice(0, length), slice(0, latent), np.ones(latent, F32))]
    if temporal:
        spans = temporal_split(length, size, max(overlap, MIN_TEMPORAL_OVERLAP))
        return [(slice(s.start, s.end), *temporal_to_latent(s)) for s in spans]
    spans = symmetric_split(length, size, max(overlap, MIN_SPATIAL_OVERLAP))
    return [(slice(s.start, s.end), *spatial_to_latent(s)) for s in spans]


def crop_frames(frames: int) -> int:
    """The 1 + 8k frames the encoder keeps (the reference crops the rest from the end)."""
    return frames - (frames - 1) % TIME_FACTOR


def latent_shape(frames: int, height: int, width: int) -> tuple[int, int, int]:
    return (crop_frames(frames) - 1) // TIME_FACTOR + 1, height // SPACE_FACTOR, width // SPACE_FACTOR


def plan_encode_tiles(frames: int, height: int, width: int, sizes: EncodeTileSizes) -> list[EncodeTile]:
    """Tiles of a (cropped) `frames` x `height` x `width` video, in the reference's order (t, h, w)."""
    axes = (_axis(crop_frames(frames), sizes.frames, sizes.frames_overlap, True),
            _axis(height, sizes.spatial, sizes.spatial_overlap, False),
            _axis(width, sizes.spatial, sizes.spatial_overlap, False))
    return [EncodeTile(tuple(a[0] for a in combo), tuple(a[1] for a in combo), tuple(a[2] for a in combo))
            for combo in itertools.product(*axes)]


def blend_encoded(shape: tuple[int, ...], tiles: Iterable[tuple[EncodeTile, np.ndarray]]) -> np.ndarray:
    """Latent (B, C, F', H', W') from (tile, its latent) pairs, applied in the order given (tile order)."""
    out = np.zeros(shape, F32)
    weight = np.zeros(shape, F32)
    for tile, latent in tiles:
        mask = tile.mask[None, None]
        where = (slice(None), slice(None), *tile.latents)
        out[where] += np.asarray(latent, F32) * mask
        weight[where] += mask
    return out / np.maximum(weight, F32(1e-8))


def tiled_encode(encode: Callable[[np.ndarray], np.ndarray], video: np.ndarray,
                 sizes: EncodeTileSizes, channels: int) -> np.ndarray:
    """Video (B, 3, F, H, W) -> latent (B, channels, F', H', W'), `encode` run on each tile in turn."""
    b, _, f, h, w = video.shape
    video = video[:, :, : crop_frames(f)]
    tiles = plan_encode_tiles(f, h, w, sizes)
    pairs = ((tile, encode(video[(slice(None), slice(None), *tile.pixels)])) for tile in tiles)
    return blend_encoded((b, channels, *latent_shape(f, h, w)), pairs)
