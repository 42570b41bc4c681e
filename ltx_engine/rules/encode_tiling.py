"""Tiled video VAE encode: the tile plan on the latent grid, tapered masks, and the normalised blend.

Pure numpy, the decode's counterpart (`decode_tiling.py`). The layout is upstream ltx-core 1.2.0's
(`prepare_tiles_for_encoding`, `VideoEncoder.tiled_encode`, `ltx_core.tiling`): each axis of the latent
grid is split in latent cells, by size (`EncodeTileSizes`: pixel sizes divided by the VAE factors, as
`TileSizeConfig`) or by count (`EncodeTileCounts`, as `TileCountConfig`); time causally (every tile
after the first starts one latent frame earlier, its left ramp one longer). A tile encodes pixels
[8b, 1 + 8(e - 1)) x [32b, 32e) and its latent lands in [b, e) under trapezoid masks (time's ramp from
0). The result is sum(latent x masks), divided by the sum of the masks unless they partition unity on
every axis, accumulated in float32 in tile order, so a farm that encodes tiles anywhere blends the same.
Before 1.2.0 the split was in pixels with 0/1 masks; 1.2.0's tapers blend across the whole overlap.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ltx_engine.rules.decode_tiling import split_symmetric, split_temporal_causal, trapezoid
from ltx_engine.rules.tiling import Interval

F32 = np.float32
TIME_FACTOR = 8
SPACE_FACTOR = 32
MIN_SPATIAL_OVERLAP = 64  # 1.2.0 refuses smaller overlaps: the conv VAE's padded edges must be dropped
MIN_TEMPORAL_OVERLAP = 16
COMPLEMENTARY_ATOL = 1e-5  # masks summing to 1 within this need no division (upstream's check)


@dataclass(frozen=True)
class EncodeTileSizes:
    """Tile sizes and overlaps in pixels; None leaves that axis whole (`TileSizeConfig`'s tile_size 0)."""

    frames: int | None = 64
    frames_overlap: int = 24
    spatial: int | None = 512
    spatial_overlap: int = 64

    def __post_init__(self) -> None:
        if self.frames is not None:
            _check("temporal", self.frames, self.frames_overlap, TIME_FACTOR, MIN_TEMPORAL_OVERLAP)
        if self.spatial is not None:
            _check("spatial", self.spatial, self.spatial_overlap, SPACE_FACTOR, MIN_SPATIAL_OVERLAP)

    def splits(self, grid: tuple[int, int, int]) -> list[list[Interval]]:
        """Per-axis latent intervals of an (F', H', W') grid."""
        f, h, w = grid
        return [_size_axis(f, self.frames, self.frames_overlap, TIME_FACTOR, True),
                _size_axis(h, self.spatial, self.spatial_overlap, SPACE_FACTOR, False),
                _size_axis(w, self.spatial, self.spatial_overlap, SPACE_FACTOR, False)]


@dataclass(frozen=True)
class EncodeTileCounts:
    """Tile counts and overlaps per axis in latent cells (`TileCountConfig`); 1 and 0 leave it whole."""

    frames: int = 1
    height: int = 1
    width: int = 1
    frames_overlap: int = 0
    height_overlap: int = 0
    width_overlap: int = 0

    def __post_init__(self) -> None:
        if min(self.frames, self.height, self.width) < 1:
            raise ValueError(f"encode tile counts {self.frames},{self.height},{self.width} must be >= 1")
        if min(self.frames_overlap, self.height_overlap, self.width_overlap) < 0:
            raise ValueError("encode tile overlaps must be >= 0")

    def splits(self, grid: tuple[int, int, int]) -> list[list[Interval]]:
        f, h, w = grid
        frames = split_count(self.frames, self.frames_overlap, f)
        return [_causal(frames), split_count(self.height, self.height_overlap, h),
                split_count(self.width, self.width_overlap, w)]


def _check(name: str, size: int, overlap: int, factor: int, min_overlap: int) -> None:
    """1.2.0's legality of a size-tiled axis: size >= 2 x factor, both multiples of it, overlap at
    least the encoder's floor and below the size."""
    if size < 2 * factor or size % factor or overlap % factor or not min_overlap <= overlap < size:
        raise ValueError(f"{name} encode tile {size} / overlap {overlap}: size >= {2 * factor}, both multiples "
                         f"of {factor}, overlap from {min_overlap} to below the size")


def _size_axis(length: int, size: int | None, overlap: int, factor: int, temporal: bool) -> list[Interval]:
    if size is None:
        return [Interval(0, length, 0, 0)]
    cells = overlap // factor
    tile = max(2, cells + 1, size // factor)
    return split_temporal_causal(tile, cells, length) if temporal else split_symmetric(tile, cells, length)


def split_count(n: int, overlap: int, length: int) -> list[Interval]:
    """Exactly n tiles sharing `overlap` cells (upstream `split_by_count`): the tile size is
    (length + overlap (n - 1)) // n and the first (remainder) tiles take one cell more each."""
    if n > length:
        raise ValueError(f"{n} encode tiles exceed the latent axis of {length}")
    if n == 1:
        return [Interval(0, length, 0, 0)]
    total = length + overlap * (n - 1)
    size, rem = divmod(total, n)
    if size <= overlap:
        raise ValueError(f"{n} encode tiles over {length} latent cells would be {size}, not above overlap {overlap}")
    base = split_symmetric(size, overlap, length - rem)
    return [Interval(iv.start + min(i, rem), iv.end + min(i, rem) + (i < rem), iv.left_ramp, iv.right_ramp)
            for i, iv in enumerate(base)]


def _causal(intervals: list[Interval]) -> list[Interval]:
    return intervals[:1] + [Interval(iv.start - 1, iv.end, iv.left_ramp + 1, iv.right_ramp) for iv in intervals[1:]]


@dataclass(frozen=True)
class EncodeTile:
    """Pixel slices (t, h, w) to encode, the latent slices they land in, and the 1-D latent masks."""

    pixels: tuple[slice, slice, slice]
    latents: tuple[slice, slice, slice]
    masks: tuple[np.ndarray, np.ndarray, np.ndarray]

    def scaled(self, latent: np.ndarray) -> np.ndarray:
        """(B, C, t, h, w) latent times the masks, axis by axis as upstream's `scale_by_masks_1d`."""
        t, h, w = self.masks
        return np.asarray(latent, F32) * t[:, None, None] * h[None, :, None] * w[None, None, :]


def _tile(t: Interval, h: Interval, w: Interval) -> EncodeTile:
    pixels = (slice(t.start * TIME_FACTOR, 1 + (t.end - 1) * TIME_FACTOR),
              slice(h.start * SPACE_FACTOR, h.end * SPACE_FACTOR), slice(w.start * SPACE_FACTOR, w.end * SPACE_FACTOR))
    masks = (trapezoid(t.length, t.left_ramp, t.right_ramp, True),
             trapezoid(h.length, h.left_ramp, h.right_ramp, False),
             trapezoid(w.length, w.left_ramp, w.right_ramp, False))
    return EncodeTile(pixels, tuple(slice(iv.start, iv.end) for iv in (t, h, w)), masks)


def crop_frames(frames: int) -> int:
    """The 1 + 8k frames the encoder keeps (the reference crops the rest from the end)."""
    return frames - (frames - 1) % TIME_FACTOR


def latent_shape(frames: int, height: int, width: int) -> tuple[int, int, int]:
    return (crop_frames(frames) - 1) // TIME_FACTOR + 1, height // SPACE_FACTOR, width // SPACE_FACTOR


def plan_encode_tiles(frames: int, height: int, width: int,
                      tiling: EncodeTileSizes | EncodeTileCounts) -> list[EncodeTile]:
    """Tiles of a (cropped) `frames` x `height` x `width` video, in upstream's order (t slowest, w fastest)."""
    splits = tiling.splits(latent_shape(frames, height, width))
    return [_tile(*ivs) for ivs in itertools.product(*splits)]


def masks_partition_unity(tiles: Sequence[EncodeTile], grid: tuple[int, int, int]) -> bool:
    """Whether each axis's masks (each distinct latent slice once) sum to 1 everywhere: then upstream
    blends without dividing by the mask sum."""
    for axis, length in enumerate(grid):
        acc, seen = np.zeros(length, F32), set()
        for tile in tiles:
            cut = tile.latents[axis]
            if (cut.start, cut.stop) not in seen:
                seen.add((cut.start, cut.stop))
                acc[cut] += tile.masks[axis]
        if np.abs(acc - F32(1.0)).max() > COMPLEMENTARY_ATOL:
            return False
    return True


def blend_encoded(shape: tuple[int, ...], tiles: Iterable[tuple[EncodeTile, np.ndarray]]) -> np.ndarray:
    """Latent (B, C, F', H', W') from (tile, its latent) pairs, applied in the order given (tile order)."""
    out = np.zeros(shape, F32)
    weight = np.zeros(shape[2:], F32)
    seen = []
    for tile, latent in tiles:
        out[(slice(None), slice(None), *tile.latents)] += tile.scaled(latent)
        weight[tile.latents] += tile.scaled(np.ones(weight[tile.latents].shape, F32))
        seen.append(tile)
    if masks_partition_unity(seen, tuple(shape[2:])):
        return out
    return out / np.maximum(weight, F32(1e-8))


def tiled_encode(encode: Callable[[np.ndarray], np.ndarray], video: np.ndarray,
                 sizes: EncodeTileSizes | EncodeTileCounts, channels: int) -> np.ndarray:
    """Video (B, 3, F, H, W) -> latent (B, channels, F', H', W'), `encode` run on each tile in turn."""
    b, _, f, h, w = video.shape
    video = video[:, :, : crop_frames(f)]
    tiles = plan_encode_tiles(f, h, w, sizes)
    pairs = ((tile, encode(video[(slice(None), slice(None), *tile.pixels)])) for tile in tiles)
    return blend_encoded((b, channels, *latent_shape(f, h, w)), pairs)
