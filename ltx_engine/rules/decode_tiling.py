"""Tiled video VAE decode: latent tile plan, pixel blend masks, and a streaming frame blender.

Pure numpy. Workers decode tiles independently; tiles are applied strictly in tile order (so the
result never depends on arrival order). FrameBlender takes whole tiles as they come and emits
finished frames as soon as no later tile can touch them (one temporal window held); blend_frames,
which the coordinator's assembly uses once the tiles touching a frame are in (final_frames, one rule
for both), builds one frame at a time from frame slices of the tiles, with the same float32 sums. Layout facts follow the reference
(ltx-core video_vae tiling: symmetric overlaps, causal temporal split, the x8 / x32 mappings).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ltx_engine.rules.tiling import Interval

F32 = np.float32
TIME_FACTOR = 8
SPACE_FACTOR = 32


def tile_size_problem(sizes: Sequence[int], overlaps: Sequence[int], factors: Sequence[int]) -> str | None:
    """The first of F,H,W pixel tile sizes that breaks the rule, with the rule and the smallest sizes that
    keep it (so one refusal is enough: a multiple that is still too small used to be a second one);
    None when all keep it. Each size is a multiple of its factor and larger than its overlap."""
    for name, size, overlap, factor in zip(("frames", "height", "width"), sizes, overlaps, factors, strict=True):
        if size % factor:
            what = f"{name} {size} is not a multiple of {factor}"
        elif size <= overlap:
            what = f"{name} tile {size} is no larger than its overlap {overlap}"
        else:
            continue
        smallest = ",".join(str((o // f + 1) * f) for o, f in zip(overlaps, factors, strict=True))
        return (f"{what}: F,H,W must be multiples of {','.join(map(str, factors))} larger than the overlaps "
                f"{','.join(map(str, overlaps))} (the smallest: {smallest})")
    return None


@dataclass(frozen=True)
class DecodeTileSizes:
    """Tile sizes in pixels: frames/overlap in time, side/overlap in space (the long side's tile)."""

    frames: int = 80
    frames_overlap: int = 24
    spatial: int = 768
    spatial_overlap: int = 64

    def __post_init__(self) -> None:
        _check_axis("temporal", self.frames, self.frames_overlap, TIME_FACTOR, 2 * TIME_FACTOR)
        _check_axis("spatial", self.spatial, self.spatial_overlap, SPACE_FACTOR, 2 * SPACE_FACTOR)


def _check_axis(name: str, size: int, overlap: int, factor: int, minimum: int) -> None:
    if size < minimum or size % factor:
        raise ValueError(f"{name} tile size must be >= {minimum} and divisible by {factor}, got {size}")
    if overlap < 0 or overlap % factor:
        raise ValueError(f"{name} overlap must be >= 0 and divisible by {factor}, got {overlap}")
    if size <= overlap:
        raise ValueError(f"{name} tile size {size} must be larger than its overlap {overlap}")


def split_symmetric(size: int, overlap: int, length: int) -> list[Interval]:
    """Tiles of `size` with `overlap`, the last ending at `length`; one tile when length <= size."""
    if size <= overlap:
        raise ValueError(f"tile size {size} must be larger than its overlap {overlap}")
    if length <= size:
        return [Interval(0, length, 0, 0)]
    stride = size - overlap
    amount = (length + size - 2 * overlap - 1) // stride
    return [
        Interval(
            i * stride,
            length if i == amount - 1 else i * stride + size,
            0 if i == 0 else overlap,
            0 if i == amount - 1 else overlap,
        )
        for i in range(amount)
    ]


def split_temporal_causal(size: int, overlap: int, length: int) -> list[Interval]:
    """Symmetric split where every tile after the first starts one latent earlier, left ramp + 1."""
    ivs = split_symmetric(size, overlap, length)
    return [ivs[0]] + [Interval(iv.start - 1, iv.end, iv.left_ramp + 1, iv.right_ramp) for iv in ivs[1:]]


def trapezoid(length: int, left: int, right: int, left_from_zero: bool) -> np.ndarray:
    """1-D ramp mask as the reference: left k/(l+1) (or k/l from 0 for causal time), right mirrored."""
    if length <= 0:
        raise ValueError("mask length must be positive")
    left, right = max(0, min(left, length)), max(0, min(right, length))
    mask = np.ones(length, dtype=np.float64)
    if left:
        k = (
            np.arange(0, left, dtype=np.float64)
            if left_from_zero
            else np.arange(1, left + 1, dtype=np.float64)
        )
        mask[:left] *= k / (left if left_from_zero else left + 1)
    if right:
        mask[length - right :] *= np.arange(right, 0, -1, dtype=np.float64) / (right + 1)
    return mask.astype(F32)


def temporal_pixel_span(iv: Interval) -> tuple[int, int, np.ndarray]:
    """Latent [b, e) -> pixel frames [8b, 1 + 8(e-1)); left ramp 1 + 8(l-1) from 0, right ramp 8r."""
    start, stop = iv.start * TIME_FACTOR, 1 + (iv.end - 1) * TIME_FACTOR
    left = 0 if iv.left_ramp == 0 else 1 + (iv.left_ramp - 1) * TIME_FACTOR
    return start, stop, trapezoid(stop - start, left, iv.right_ramp * TIME_FACTOR, True)


def spatial_pixel_span(iv: Interval) -> tuple[int, int, np.ndarray]:
    """Latent [b, e) -> pixels [32b, 32e) with ramps x32."""
    start, stop = iv.start * SPACE_FACTOR, iv.end * SPACE_FACTOR
    return (
        start,
        stop,
        trapezoid(stop - start, iv.left_ramp * SPACE_FACTOR, iv.right_ramp * SPACE_FACTOR, False),
    )


@dataclass(frozen=True)
class DecodeTile:
    """One decode tile: latent intervals (f, h, w), pixel spans [start, stop) and 1-D pixel masks."""

    index: int
    latent: tuple[Interval, Interval, Interval]
    pixel: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]
    masks_1d: tuple[np.ndarray, np.ndarray, np.ndarray]

    def latent_slices(self) -> tuple[slice, slice, slice]:
        return tuple(slice(iv.start, iv.end) for iv in self.latent)  # type: ignore[return-value]

    def pixel_slices(self) -> tuple[slice, slice, slice]:
        return tuple(slice(a, b) for a, b in self.pixel)  # type: ignore[return-value]

    @property
    def pixel_shape(self) -> tuple[int, int, int]:
        return tuple(b - a for a, b in self.pixel)  # type: ignore[return-value]

    def mask(self) -> np.ndarray:
        """Separable (frames, height, width) pixel blend mask."""
        mf, mh, mw = self.masks_1d
        return (mf[:, None, None] * mh[None, :, None]) * mw[None, None, :]


def latent_tile_sizes(latent_grid: tuple[int, int, int], sizes: DecodeTileSizes) -> tuple[int, int, int, int]:
    """(time size, time overlap, height size, width size) in latents.

    Spatial tiles are scaled from the long side (round(size * axis / long)), never below overlap + 1;
    the spatial overlap in latents is sizes.spatial_overlap // 32.
    """
    _, h, w = latent_grid
    long_side = max(h, w)
    size, ov = sizes.spatial // SPACE_FACTOR, sizes.spatial_overlap // SPACE_FACTOR
    lower = max(2, ov + 1)
    h_size = max(lower, round(size * h / long_side))
    w_size = max(lower, round(size * w / long_side))
    return sizes.frames // TIME_FACTOR, sizes.frames_overlap // TIME_FACTOR, h_size, w_size


def plan_decode_tiles(latent_shape: Sequence[int], sizes: DecodeTileSizes | None = None) -> list[DecodeTile]:
    """Decode tiles of a (..., F, H, W) latent, numbered frames -> height -> width; None = one tile."""
    f, h, w = (int(x) for x in latent_shape[-3:])
    if min(f, h, w) < 1:
        raise ValueError(f"latent grid must be positive, got {(f, h, w)}")
    if sizes is None:
        axes = [[Interval(0, f, 0, 0)], [Interval(0, h, 0, 0)], [Interval(0, w, 0, 0)]]
    else:
        t_size, t_ov, h_size, w_size = latent_tile_sizes((f, h, w), sizes)
        s_ov = sizes.spatial_overlap // SPACE_FACTOR
        t_ivs = [Interval(0, f, 0, 0)] if f <= t_size else split_temporal_causal(t_size, t_ov, f)
        axes = [t_ivs, split_symmetric(h_size, s_ov, h), split_symmetric(w_size, s_ov, w)]
    return tiles_from_axes(axes)


def tiles_from_axes(axes: Sequence[Sequence[Interval]]) -> list[DecodeTile]:
    """The product of per-axis latent intervals as decode tiles with their pixel spans and ramps,
    numbered frames -> height -> width."""
    tiles: list[DecodeTile] = []
    for fi in axes[0]:
        t0, t1, mf = temporal_pixel_span(fi)
        for hi in axes[1]:
            h0, h1, mh = spatial_pixel_span(hi)
            for wi in axes[2]:
                w0, w1, mw = spatial_pixel_span(wi)
                tiles.append(
                    DecodeTile(len(tiles), (fi, hi, wi), ((t0, t1), (h0, h1), (w0, w1)), (mf, mh, mw))
                )
    return tiles


def pixel_frames(latent_frames: int) -> int:
    return 1 + (latent_frames - 1) * TIME_FACTOR


def final_frames(tiles: Sequence[DecodeTile], landed: Collection[int]) -> int:
    """How many frames, from the first, are final once the tiles in `landed` are in: a frame is final
    when every tile touching it is, i.e. it lies before the first start of the tiles still missing
    (temporal overlaps blend, so a frame waits for each tile that reaches it). The blend's release rule
    (FrameBlender) and the early encode's (coordinator/assemble/early.py) are this one."""
    missing = [t.pixel[0][0] for t in tiles if t.index not in landed]
    return min(missing) if missing else max((t.pixel[0][1] for t in tiles), default=0)


def blend_window(tiles: Sequence[DecodeTile]) -> int:
    """Frames a FrameBlender holds at once: before tile i is applied, every frame below the first
    start of tiles[i:] has been released."""
    widest, reach = 0, 0
    for i, tile in enumerate(tiles):
        base = 0 if i == 0 else min(t.pixel[0][0] for t in tiles[i:])
        reach = max(reach, tile.pixel[0][1])
        widest = max(widest, reach - base)
    return widest


class FrameBlender:
    """Blends decoded tiles (B, C, f, h, w) in tile order and yields finished frames (B, C, H, W) in order.

    Tiles may arrive in any order; they are applied strictly by index. The accumulator is allocated
    once at the plan's widest temporal window and tiles are added frame by frame, so the blender holds
    one window of frames (and one frame of temporaries), never a copy of a whole tile.
    """

    def __init__(self, tiles: Sequence[DecodeTile], batch: int = 1, channels: int = 3) -> None:
        if not tiles or [t.index for t in tiles] != list(range(len(tiles))):
            raise ValueError("tiles must be a non-empty plan numbered 0..n-1")
        self._tiles = list(tiles)
        self._bc = (batch, channels)
        self._hw = (max(t.pixel[1][1] for t in tiles), max(t.pixel[2][1] for t in tiles))
        self.total_frames = max(t.pixel[0][1] for t in tiles)
        self._pending: dict[int, np.ndarray] = {}
        self._next = 0
        self._emitted = 0
        self._have = 0  # one past the last frame any applied tile reached
        self.window_frames = blend_window(self._tiles)
        self._acc = np.zeros((*self._bc, self.window_frames, *self._hw), dtype=F32)
        self._wsum = np.zeros((self.window_frames, *self._hw), dtype=F32)

    @property
    def done(self) -> bool:
        return self._emitted == self.total_frames

    def add(self, index: int, pixels: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """Take tile `index`'s decoded pixels; return (frame_index, frame) pairs that are now final."""
        return list(self.stream(index, pixels))

    def stream(self, index: int, pixels: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """As `add`, but each released frame is computed when it is taken, so the released frames never
        exist all at once; take them all before the next call."""
        if not 0 <= index < len(self._tiles) or index < self._next or index in self._pending:
            raise ValueError(f"unexpected or duplicate decode tile {index}")
        tile = self._tiles[index]
        want = (*self._bc, *tile.pixel_shape)
        if tuple(pixels.shape) != want:
            raise ValueError(f"tile {index} pixels {pixels.shape} != expected {want}")
        self._pending[index] = pixels
        return self._drain()

    def _drain(self) -> Iterator[tuple[int, np.ndarray]]:
        while self._next in self._pending:
            self._apply(self._tiles[self._next], self._pending.pop(self._next))
            self._next += 1
            yield from self._flush()

    def _apply(self, tile: DecodeTile, pixels: np.ndarray) -> None:
        """acc += pixels * mask, wsum += mask, one frame at a time (the same float32 products as the
        whole-tile mask: (mf * mh) * mw per element)."""
        (t0, t1), (h0, h1), (w0, w1) = tile.pixel
        if t0 < self._emitted:
            raise ValueError(f"tile {tile.index} reaches frame {t0}, already emitted")
        mf, mh, mw = tile.masks_1d
        for k in range(t1 - t0):
            plane = (mf[k] * mh[:, None]) * mw[None, :]
            i = t0 + k - self._emitted
            self._acc[:, :, i, h0:h1, w0:w1] += pixels[:, :, k].astype(F32) * plane[None, None]
            self._wsum[i, h0:h1, w0:w1] += plane
        self._have = max(self._have, t1)

    def _flush(self) -> Iterator[tuple[int, np.ndarray]]:
        """Emit frames no later tile can touch; then shift the rest of the window to its start."""
        ready = final_frames(self._tiles, range(self._next))  # applied strictly in order: tiles below _next
        for fr in range(self._emitted, ready):
            i = fr - self._emitted
            frame = self._acc[:, :, i] / np.maximum(self._wsum[i], F32(1e-8))[None, None]
            yield fr, frame.astype(F32, copy=False)
        if ready > self._emitted:
            cut, used = ready - self._emitted, max(0, self._have - self._emitted)
            for i in range(cut, used):  # forward copy: the source is always ahead of the target
                self._acc[:, :, i - cut] = self._acc[:, :, i]
                self._wsum[i - cut] = self._wsum[i]
            self._acc[:, :, max(0, used - cut) : used] = 0.0
            self._wsum[max(0, used - cut) : used] = 0.0
            self._emitted = ready


class TileFrames(Protocol):
    """A decoded tile (B, C, f, h, w) that hands out one frame at a time: `tile[:, :, k]`. A numpy
    array is one; the coordinator's blob-backed reader is another (it reads that frame only)."""

    shape: tuple[int, ...]

    def __getitem__(self, key: tuple) -> np.ndarray: ...


def frame_bytes(tiles: Sequence[DecodeTile], batch: int = 1, channels: int = 3) -> int:
    """What blend_frames holds: one frame's float32 accumulator and weight sum, plus the largest
    tile frame it reads (as float32) and its weighted copy."""
    h, w = max(t.pixel[1][1] for t in tiles), max(t.pixel[2][1] for t in tiles)
    tile = max(t.pixel_shape[1] * t.pixel_shape[2] for t in tiles)
    return batch * channels * h * w * 4 + h * w * 4 + 2 * batch * channels * tile * 4


def blend_frames(tiles: Sequence[DecodeTile], sources: Callable[[int], TileFrames], batch: int = 1,
                 channels: int = 3) -> Iterator[tuple[int, np.ndarray]]:
    """Every frame in order, each summed from the tiles that cover it in tile order: the same float32
    sums as FrameBlender, so bit-identical, while holding one frame's accumulator and weight sum
    instead of a temporal window's, and reading tiles a frame at a time. Frame fr asks sources(i) only
    for the tiles touching it, the first time one does (taken once and kept): taking frames below
    final_frames(tiles, landed) reads landed tiles alone (the early encode)."""
    if not tiles or [t.index for t in tiles] != list(range(len(tiles))):
        raise ValueError("tiles must be a non-empty plan numbered 0..n-1")
    height, width = max(t.pixel[1][1] for t in tiles), max(t.pixel[2][1] for t in tiles)
    acc = np.zeros((batch, channels, height, width), dtype=F32)
    wsum = np.zeros((height, width), dtype=F32)
    opened: dict[int, TileFrames] = {}
    for fr in range(max(t.pixel[0][1] for t in tiles)):
        acc.fill(0.0)
        wsum.fill(0.0)
        for tile in tiles:
            (t0, t1), (h0, h1), (w0, w1) = tile.pixel
            if t0 <= fr < t1:
                if tile.index not in opened:
                    opened[tile.index] = _checked(tile, sources(tile.index), batch, channels)
                mf, mh, mw = tile.masks_1d
                plane = (mf[fr - t0] * mh[:, None]) * mw[None, :]
                acc[:, :, h0:h1, w0:w1] += opened[tile.index][:, :, fr - t0].astype(F32, copy=False) * plane[None, None]
                wsum[h0:h1, w0:w1] += plane
        yield fr, acc / np.maximum(wsum, F32(1e-8))[None, None]


def _checked(tile: DecodeTile, source: TileFrames | None, batch: int, channels: int) -> TileFrames:
    want = (batch, channels, *tile.pixel_shape)
    if source is None:
        raise RuntimeError(f"decode tile {tile.index} has no pixels")
    if tuple(source.shape) != want:
        raise ValueError(f"tile {tile.index} pixels {tuple(source.shape)} != expected {want}")
    return source


def blend_decoded(
    tiles: Sequence[DecodeTile], outputs: Sequence[np.ndarray]
) -> Iterator[tuple[int, np.ndarray]]:
    """Blend a full set of decoded tiles (in tile order) and yield every frame in order."""
    if len(outputs) != len(tiles):
        raise ValueError(f"{len(outputs)} outputs for {len(tiles)} tiles")
    b, c = outputs[0].shape[:2]
    blender = FrameBlender(tiles, b, c)
    for i, out in enumerate(outputs):
        yield from blender.stream(i, out)
