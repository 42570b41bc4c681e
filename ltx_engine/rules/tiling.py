"""Tiled data parallel (stage 2): tile layout, blend masks, per-tile token sets, the reduce.

Pure numpy (float32 arrays, int64 indices). The coordinator cuts tile inputs and sums tile outputs
with these functions and the in-process path calls the same ones, so both give bit-identical
results. Layout facts follow the reference (ltx-core tiling / modality_tiling): token order
f*H*W + h*W + w, tiles numbered frames slowest, width fastest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

F32 = np.float32


@dataclass(frozen=True)
class DimensionTilingConfig:
    """Tiles along one latent axis: count and overlap in latent cells (1, 0 = untiled)."""

    num_tiles: int = 1
    overlap: int = 0

    def __post_init__(self) -> None:
        if self.num_tiles < 1:
            raise ValueError(f"num_tiles must be >= 1, got {self.num_tiles}")
        if self.overlap < 0:
            raise ValueError(f"overlap must be >= 0, got {self.overlap}")


@dataclass(frozen=True)
class TileCountConfig:
    """Tile counts per axis of the (F, H, W) latent grid."""

    frames: DimensionTilingConfig = DimensionTilingConfig()
    height: DimensionTilingConfig = DimensionTilingConfig()
    width: DimensionTilingConfig = DimensionTilingConfig()

    @classmethod
    def balanced(cls, num_tiles: int, overlap: int = 5) -> TileCountConfig:
        """Spatial grid as square as possible: height the smaller factor, time untiled."""
        small, large = balanced_tile_split(num_tiles)
        return cls(height=DimensionTilingConfig(small, overlap), width=DimensionTilingConfig(large, overlap))

    @property
    def num_tiles(self) -> int:
        return self.frames.num_tiles * self.height.num_tiles * self.width.num_tiles


def balanced_tile_split(n: int) -> tuple[int, int]:
    """(small, n // small) with small the largest divisor of n not above isqrt(n)."""
    if n < 1:
        raise ValueError(f"num_tiles must be >= 1, got {n}")
    small = next(d for d in range(math.isqrt(n), 0, -1) if n % d == 0)
    return small, n // small


@dataclass(frozen=True)
class Interval:
    """Half-open [start, end) on one axis with blend ramp lengths at each side."""

    start: int
    end: int
    left_ramp: int
    right_ramp: int

    @property
    def length(self) -> int:
        return self.end - self.start


SplitFn = Callable[[int], list[Interval]]


def _check_ramps(intervals: list[Interval], what: str) -> list[Interval]:
    """Reject tiles shorter than their two ramps: three tiles would share a cell and masks stop summing to 1.

    (Stricter than the reference, which silently produces non-normalised blends there.)
    """
    for i, iv in enumerate(intervals):
        if iv.length < iv.left_ramp + iv.right_ramp:
            raise ValueError(
                f"{what}: tile {i} [{iv.start}, {iv.end}) is shorter than its ramps "
                f"{iv.left_ramp}+{iv.right_ramp}; use fewer tiles or a smaller overlap"
            )
    return intervals


def split_by_size(size: int, overlap: int) -> SplitFn:
    """Tiles of `size` sharing `overlap` cells; tile i starts at i*(size-overlap), the last ends at L."""
    if size <= 0:
        raise ValueError(f"tile size must be > 0, got {size}")
    if overlap < 0 or size <= overlap:
        raise ValueError(f"tile size {size} must be larger than its overlap {overlap}")

    def split(length: int) -> list[Interval]:
        if length < 1:
            raise ValueError(f"axis length must be >= 1, got {length}")
        if length <= size:
            return [Interval(0, length, 0, 0)]
        stride = size - overlap
        amount = (length + size - 2 * overlap - 1) // stride
        out = []
        for i in range(amount):
            start = i * stride
            end = length if i == amount - 1 else start + size
            out.append(Interval(start, end, 0 if i == 0 else overlap, 0 if i == amount - 1 else overlap))
        return _check_ramps(out, f"split_by_size({size}, {overlap})({length})")

    return split


def split_by_count(n: int, overlap: int) -> SplitFn:
    """Exactly n tiles with `overlap`; the first (total % n) tiles absorb one extra cell each."""
    if n < 1:
        raise ValueError(f"num_tiles must be >= 1, got {n}")
    if overlap < 0:
        raise ValueError(f"overlap must be >= 0, got {overlap}")

    def split(length: int) -> list[Interval]:
        if n > length:
            raise ValueError(f"num_tiles {n} exceeds the axis length {length}: a tile needs at least 1 cell")
        if n == 1:
            return [Interval(0, length, 0, 0)]
        total = length + overlap * (n - 1)
        size, rem = divmod(total, n)
        if size <= overlap:
            raise ValueError(
                f"{n} tiles over length {length} would be {size} cells, not larger than overlap {overlap}"
            )
        if n > 2 and size < 2 * overlap:
            raise ValueError(
                f"{n} tiles over length {length} would be {size} cells, shorter than their two ramps "
                f"(2 x overlap {overlap}); masks would not sum to 1"
            )
        base = split_by_size(size, overlap)(length - rem)
        out = [
            Interval(
                iv.start + min(i, rem),
                iv.end + min(i, rem) + (1 if i < rem else 0),
                iv.left_ramp,
                iv.right_ramp,
            )
            for i, iv in enumerate(base)
        ]
        return _check_ramps(out, f"split_by_count({n}, {overlap})({length})")

    return split


def ramp_mask_1d(length: int, left: int, right: int) -> np.ndarray:
    """Trapezoid: k/(l+1) for k = 1..l on the left, mirrored on the right, 1 elsewhere (float32)."""
    if length <= 0:
        raise ValueError("mask length must be positive")
    left, right = max(0, min(left, length)), max(0, min(right, length))
    mask = np.ones(length, dtype=np.float64)
    if left:
        mask[:left] *= np.arange(1, left + 1, dtype=np.float64) / (left + 1)
    if right:
        mask[length - right :] *= np.arange(right, 0, -1, dtype=np.float64) / (right + 1)
    return mask.astype(F32)


@dataclass(frozen=True)
class Tile:
    """One TDP tile: its index in tile order and its (frames, height, width) intervals."""

    index: int
    frames: Interval
    height: Interval
    width: Interval

    @property
    def intervals(self) -> tuple[Interval, Interval, Interval]:
        return self.frames, self.height, self.width

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.frames.length, self.height.length, self.width.length

    @property
    def num_tokens(self) -> int:
        f, h, w = self.shape
        return f * h * w

    def slices(self) -> tuple[slice, slice, slice]:
        return tuple(slice(iv.start, iv.end) for iv in self.intervals)  # type: ignore[return-value]

    def masks_1d(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return tuple(ramp_mask_1d(iv.length, iv.left_ramp, iv.right_ramp) for iv in self.intervals)  # type: ignore[return-value]

    def mask(self) -> np.ndarray:
        """Separable blend mask (f, h, w): the outer product of the three 1-D ramps."""
        mf, mh, mw = self.masks_1d()
        return (mf[:, None, None] * mh[None, :, None]) * mw[None, None, :]


def _axis_split(cfg: DimensionTilingConfig) -> SplitFn:
    return split_by_count(cfg.num_tiles, cfg.overlap)


def plan_tiles(grid: tuple[int, int, int], counts: TileCountConfig) -> list[Tile]:
    """All tiles of the grid, numbered frames -> height -> width (width fastest)."""
    f, h, w = grid
    per_axis = [
        _axis_split(counts.frames)(f),
        _axis_split(counts.height)(h),
        _axis_split(counts.width)(w),
    ]
    tiles = []
    for fi in per_axis[0]:
        for hi in per_axis[1]:
            for wi in per_axis[2]:
                tiles.append(Tile(len(tiles), fi, hi, wi))
    return tiles


def generated_token_indices(tile: Tile, grid: tuple[int, int, int]) -> np.ndarray:
    """Flat indices f*H*W + h*W + w of the tile's generated tokens, in tile (f, h, w) order."""
    _, gh, gw = grid
    f = np.arange(tile.frames.start, tile.frames.end, dtype=np.int64)
    h = np.arange(tile.height.start, tile.height.end, dtype=np.int64)
    w = np.arange(tile.width.start, tile.width.end, dtype=np.int64)
    return (f[:, None, None] * (gh * gw) + h[None, :, None] * gw + w[None, None, :]).reshape(-1)


@dataclass(frozen=True)
class TileTokens:
    """Which tokens one tile sees, how its output blends back, and its position offset.

    gen_indices: generated token indices (tile order); cond_indices: kept conditioning tokens as
    indices into the FULL sequence (>= num_generated); cond_weights: 1 / #tiles keeping each;
    offset (B, axes, 1, 1): subtracted from positions when normalising.
    """

    tile: Tile
    num_generated: int
    gen_indices: np.ndarray
    cond_indices: np.ndarray
    cond_weights: np.ndarray
    offset: np.ndarray

    @property
    def keep_indices(self) -> np.ndarray:
        return np.concatenate([self.gen_indices, self.cond_indices])

    @property
    def num_tokens(self) -> int:
        return int(self.gen_indices.size + self.cond_indices.size)

    def weights(self) -> np.ndarray:
        """Per kept token blend weight: the tile mask (generated), then 1/#keepers (conditioning)."""
        return np.concatenate([self.tile.mask().reshape(-1), self.cond_weights.astype(F32)])


def _tile_bounds(positions: np.ndarray, gen_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-(batch, axis) min start and max end of the tile's generated tokens."""
    sel = positions[:, :, gen_idx, :]
    return sel[..., 0].min(axis=2), sel[..., 1].max(axis=2)


def cond_keep_matrix(
    tiles: Sequence[Tile], positions: np.ndarray, cond_positions: np.ndarray, grid: tuple[int, int, int]
) -> np.ndarray:
    """(num_tiles, Tc) bool: a tile keeps a conditioning token overlapping it on all axes or with t < 0."""
    num_cond = cond_positions.shape[2]
    keep = np.zeros((len(tiles), num_cond), dtype=bool)
    if num_cond == 0:
        return keep
    negative_time = (cond_positions[:, 0, :, 0] < 0).any(axis=0)
    for i, tile in enumerate(tiles):
        start, end = _tile_bounds(positions, generated_token_indices(tile, grid))
        overlaps = (cond_positions[..., 0] < end[..., None]) & (cond_positions[..., 1] > start[..., None])
        keep[i] = overlaps.all(axis=1).any(axis=0) | negative_time
    return keep


def _check_positions(positions: np.ndarray, cond_positions: np.ndarray, grid: tuple[int, int, int]) -> None:
    if positions.ndim != 4 or positions.shape[-1] != 2 or positions.shape[2] != math.prod(grid):
        raise ValueError(
            f"positions {positions.shape} must be (B, axes, {math.prod(grid)}, 2) for grid {grid}"
        )
    if (
        cond_positions.ndim != 4
        or cond_positions.shape[:2] != positions.shape[:2]
        or cond_positions.shape[3] != 2
    ):
        raise ValueError(
            f"cond_positions {cond_positions.shape} must be (B, axes, Tc, 2) like {positions.shape}"
        )


def tile_token_sets(
    tiles: Sequence[Tile], positions: np.ndarray, cond_positions: np.ndarray, grid: tuple[int, int, int]
) -> list[TileTokens]:
    """TileTokens for every tile, with conditioning weights counted across all tiles."""
    _check_positions(positions, cond_positions, grid)
    num_gen = math.prod(grid)
    keep = cond_keep_matrix(tiles, positions, cond_positions, grid)
    keepers = keep.sum(axis=0)
    out = []
    for i, tile in enumerate(tiles):
        gen_idx = generated_token_indices(tile, grid)
        cond_local = np.nonzero(keep[i])[0].astype(np.int64)
        weights = (np.float64(1.0) / keepers[cond_local]).astype(F32)
        start, _ = _tile_bounds(positions, gen_idx)
        out.append(
            TileTokens(
                tile=tile,
                num_generated=num_gen,
                gen_indices=gen_idx,
                cond_indices=cond_local + num_gen,
                cond_weights=weights,
                offset=start[:, :, None, None].astype(positions.dtype),
            )
        )
    return out


def tile_token_set(
    tile: Tile,
    positions: np.ndarray,
    cond_positions: np.ndarray,
    grid: tuple[int, int, int],
    all_tiles: Sequence[Tile],
) -> TileTokens:
    """TileTokens of one tile; `all_tiles` is the whole plan (weights count every keeper)."""
    return tile_token_sets(all_tiles, positions, cond_positions, grid)[tile.index]


@dataclass(frozen=True)
class TileInputs:
    """What one tile forward needs: its tokens, per-token timesteps and (normalised) positions."""

    latent: np.ndarray
    timesteps: np.ndarray
    positions: np.ndarray


def cut_tile_inputs(
    latent: np.ndarray,
    timesteps: np.ndarray,
    positions: np.ndarray,
    tokens: TileTokens,
    normalize_positions: bool = True,
) -> TileInputs:
    """Slice the full sequence (generated + conditioning) to the tile's kept tokens."""
    idx = tokens.keep_indices
    pos = positions[:, :, idx, :]
    if normalize_positions:
        pos = pos - tokens.offset
    return TileInputs(latent=latent[:, idx], timesteps=timesteps[:, idx], positions=pos)


def masked_tile_output(tokens: TileTokens, tile_output: np.ndarray) -> np.ndarray:
    """The tile's output times its blend weights (what a worker returns for the reduce)."""
    if tile_output.shape[1] != tokens.num_tokens:
        raise ValueError(f"tile output has {tile_output.shape[1]} tokens, tile keeps {tokens.num_tokens}")
    return (tile_output.astype(F32) * tokens.weights()[None, :, None]).astype(F32)


def scatter_masked(buffer: np.ndarray, tokens: TileTokens, masked: np.ndarray) -> np.ndarray:
    """Add an already-masked tile output into the full-size buffer (in place; returns it)."""
    buffer[:, tokens.keep_indices] += masked
    return buffer


def blend_tile_output(buffer: np.ndarray, tokens: TileTokens, tile_output: np.ndarray) -> np.ndarray:
    """Accumulate mask x output (generated) and weight x output (conditioning) into buffer."""
    return scatter_masked(buffer, tokens, masked_tile_output(tokens, tile_output))


def reduce_tiles(outputs_in_tile_order: Sequence[np.ndarray]) -> np.ndarray:
    """Sum full-size tile contributions in tile order (the all-reduce), deterministic."""
    if not outputs_in_tile_order:
        raise ValueError("no tile outputs to reduce")
    acc = np.zeros_like(outputs_in_tile_order[0], dtype=F32)
    for out in outputs_in_tile_order:
        acc += out
    return acc


def reduce_masked_outputs(
    shape: tuple[int, int, int], tokens: Sequence[TileTokens], masked_outputs: Sequence[np.ndarray]
) -> np.ndarray:
    """Scatter masked tile outputs into one zero buffer in tile order (equal to reduce_tiles)."""
    if len(tokens) != len(masked_outputs):
        raise ValueError(f"{len(masked_outputs)} outputs for {len(tokens)} tiles")
    buffer = np.zeros(shape, dtype=F32)
    for tt, masked in zip(tokens, masked_outputs, strict=True):
        scatter_masked(buffer, tt, masked)
    return buffer


def average_audio(outputs: Sequence[np.ndarray]) -> np.ndarray:
    """Mean of the untiled audio outputs of all tile forwards, summed in tile order (context only)."""
    return (reduce_tiles(outputs) / F32(len(outputs))).astype(F32)
