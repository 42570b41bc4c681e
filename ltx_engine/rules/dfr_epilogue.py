"""DFR's spatial epilogue and keyframe-aware decode: the pure rules. Pure python/numpy.

Upstream after 1.2.0 (`dfr_stages.run_spatial_epilogue`, `dfr_helpers/ops.py`; absent from ltx-core
1.0.0, so the tests write these formulas): with `spatial_upscalings == 2` the stages run at half size
and the epilogue details the whole canvas at full size with the detailing IC-LoRA. Every carried
keyframe is decoded as its own one-frame clip, Lanczos-stretched x2 in RGB and encoded again (a
strength-1 condition at its frame); the video latent is spatially upsampled and denoised over the
stage-2 sigmas, its spatial tiles blended after every step: the first step on a coarse 2x2 grid, the
rest on 4x4 (a one-step schedule stays 2x2), overlap 10 latent cells clamped to the latent (upstream's
`clamp_dim_tiling`). Noise: seed + 2000 (+ 100 per temporal window); ancestral re-noise on LTX-2.5
from seed + 30000.

The decode's keyframes (upstream `decode_keyframes_from_slots`): the final carried keyframe planes
whose pixel frame lies inside the trimmed clip, with their global frames; a decode tile sees the planes
inside its frames plus the nearest one on each side (`planes_for_tile`). The conv decoder ignores
them, as the MLX port says its does; the diffusion decoder attends to them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SPATIAL_OVERLAP = 10
COARSE_TILES = 2
FINE_TILES = 4
KEYFRAME_STRENGTH = 1.0
NOISE_SEED_OFFSET = 2000
WINDOW_SEED_STRIDE = 100
ANCESTRAL_NOISE_SEED_OFFSET = 30000
KEYFRAME_DECODE_SEED_OFFSET = 4000


def clamp_dim(dim: int, tiles: int, overlap: int) -> tuple[int, int]:
    """(tiles, overlap) on an axis of `dim` cells: one tile when fewer cells than tiles, the overlap at
    most dim - tiles (so every tile is larger than it), untouched for one tile."""
    if tiles <= 1:
        return tiles, overlap
    if dim < tiles:
        return 1, 0
    return tiles, min(overlap, dim - tiles)


def farm_overlap(dim: int, tiles: int, overlap: int) -> int:
    """The overlap clamped further, where needed, so each tile holds its two ramps: the farm's tiling
    (`ltx_engine.rules.tiling`) keeps masks that sum to 1 and refuses a tile shorter than 2 x overlap, which
    upstream's clamp allows (4 tiles over 48 cells at 10). Upstream's value wherever it fits."""
    while overlap > 0 and (dim + overlap * (tiles - 1)) // tiles < 2 * overlap:
        overlap -= 1
    return overlap


def step_tilings(
    grid: tuple[int, int, int], steps: int
) -> list[tuple[tuple[int, int, int], tuple[int, int, int]]]:
    """Per denoising step of a window: (tile counts, overlaps) per (frames, height, width) axis."""
    if steps < 1:
        raise ValueError(f"the epilogue needs at least one step, got {steps}")
    out = []
    for step in range(steps):
        n = COARSE_TILES if step == 0 else FINE_TILES
        (h, oh), (w, ow) = clamp_dim(grid[1], n, SPATIAL_OVERLAP), clamp_dim(grid[2], n, SPATIAL_OVERLAP)
        oh, ow = farm_overlap(grid[1], h, oh) if h > 1 else 0, farm_overlap(grid[2], w, ow) if w > 1 else 0
        out.append(((1, h, w), (0, oh, ow)))
    return out


def decode_keyframes(
    planes: np.ndarray, positions: Sequence[int], num_frames: int
) -> tuple[np.ndarray, tuple[int, ...]]:
    """The planes (B, C, K, h, w) and global pixel frames of the keyframes a decode of `num_frames`
    frames receives: those inside [0, num_frames) (the canvas padding's are dropped); K may be 0."""
    if planes.ndim != 5 or planes.shape[2] != len(positions):
        raise ValueError(f"{planes.shape} keyframe planes for {len(positions)} positions")
    keep = [i for i, p in enumerate(positions) if 0 <= int(p) < num_frames]
    return np.ascontiguousarray(planes[:, :, keep]), tuple(int(positions[i]) for i in keep)


def planes_for_tile(positions: Sequence[int], frame_lo: int, frame_hi: int) -> list[int]:
    """Indices of the planes a decode tile over pixel frames [lo, hi] sees: those inside it plus the
    nearest plane before and after, so a tile's edge ranks the same planes as a whole decode."""
    inside = [i for i, p in enumerate(positions) if frame_lo <= p <= frame_hi]
    before = [i for i, p in enumerate(positions) if p < frame_lo]
    after = [i for i, p in enumerate(positions) if p > frame_hi]
    picked = ([max(before, key=lambda i: positions[i])] if before else []) + inside
    picked += [min(after, key=lambda i: positions[i])] if after else []
    return sorted(picked)


def keyframe_stage_times(positions: Sequence[int], stride: int, origin: float = 0.0) -> np.ndarray:
    """Each plane's time in a decoder stage of temporal stride `stride`: the centre of the stage cell
    holding it, (f + (stride - 1) / 2) / stride, frame 0 at 0, minus `origin` (upstream `keyframe_stage_times`)."""
    frames = np.asarray(positions, np.float32)
    times = (frames + np.float32((stride - 1) / 2)) / np.float32(stride)
    return np.where(frames == 0, np.float32(0), times).astype(np.float32) - np.float32(origin)


def task_keyframes(params: dict, inputs: dict) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """A decode task's keyframes as the planner named them (`plan/decode_keyframes.keyframe_decode_io`):
    the planes it attends to, from DFR's stacked `keyframes` or one `keyframe{i}` input per plane (the
    images'), and their global pixel frames; None when it has none."""
    picked = [int(i) for i in params.get("keyframe_planes") or ()]
    if not picked:
        return None
    frames = tuple(int(params["keyframe_frames"][i]) for i in picked)
    if "keyframes" in inputs:
        return np.ascontiguousarray(inputs["keyframes"][:, :, picked]), frames
    return np.ascontiguousarray(np.concatenate([inputs[f"keyframe{i}"] for i in picked], axis=2)), frames
