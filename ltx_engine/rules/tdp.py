"""Tiled data parallel stage 2, as steps of pure numpy math around per-tile transformer forwards.

A step: cut the current latent into tile inputs (only each tile's tokens, timesteps and normalised
positions), run one forward per tile anywhere, then mask each tile's velocity, sum in tile order and
take the Euler step. The coordinator and the in-process reference both call these functions.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from ltx_engine.rules import sampling
from ltx_engine.rules.tiling import (
    DimensionTilingConfig,
    Tile,
    TileCountConfig,
    TileTokens,
    balanced_tile_split,
    cut_tile_inputs,
    masked_tile_output,
    plan_tiles,
    reduce_masked_outputs,
    tile_token_sets,
)

F32 = np.float32
_TILES = re.compile(r"^(?:(\d+)x)?(\d+)x(\d+)$")


def parse_tile_counts(text: str, workers: int = 1) -> tuple[int, int, int]:
    """'auto' | 'HxW' | 'FxHxW' → (frames, height, width) tile counts; auto balances over workers."""
    if text == "auto":
        return (1, *balanced_tile_split(max(1, workers)))
    match = _TILES.match(text.strip().lower())
    if not match:
        raise ValueError(f"stage-2 tiles {text!r} is not auto, HxW or FxHxW")
    frames, height, width = match.groups()
    return int(frames or 1), int(height), int(width)


def tile_counts(counts: tuple[int, int, int], overlap: int | Sequence[int]) -> TileCountConfig:
    """Counts per axis with the overlap on every tiled axis (an untiled axis has none); `overlap` one
    for all axes, or one per axis (DFR's epilogue clamps each axis to its latent)."""
    per_axis = [int(overlap)] * 3 if isinstance(overlap, int | np.integer) else [int(x) for x in overlap]
    return TileCountConfig(*(DimensionTilingConfig(n, o if n > 1 else 0) for n, o in zip(counts, per_axis, strict=True)))


def plan(grid: tuple[int, int, int], counts: tuple[int, int, int], overlap: int) -> list[Tile]:
    """The tiles of a latent grid; raises ValueError when a tile would be no larger than its overlap."""
    return plan_tiles(grid, tile_counts(counts, overlap))


def token_sets(grid: tuple[int, int, int], counts: tuple[int, int, int], overlap: int,
               positions: np.ndarray) -> list[TileTokens]:
    """Each tile's tokens: its generated ones and the conditioning tokens (after them) it keeps."""
    num_gen = int(np.prod(grid))
    return tile_token_sets(plan(grid, counts, overlap), positions[:, :, :num_gen], positions[:, :, num_gen:], grid)


def first_frame_marker(grid: tuple[int, int, int], num_tokens: int,
                       slot_range: tuple[int, int] | None = None) -> np.ndarray:
    """(1, T, 1) LTX-2.5 keyframe marker of a stage-2 state: its first latent frame (one pixel frame),
    as upstream marks every video state's, and DFR's generated slots; other appended tokens unmarked."""
    marker = np.zeros((1, num_tokens, 1), F32)
    marker[:, : grid[1] * grid[2]] = 1.0
    if slot_range is not None:
        marker[:, slot_range[0] : slot_range[1]] = 1.0
    return marker


def step_tile_inputs(latent: np.ndarray, mask: np.ndarray, positions: np.ndarray, sigma: float,
                     sets: list[TileTokens], marker: np.ndarray | None = None) -> list[dict[str, np.ndarray]]:
    """What each tile forward of a step reads: its tokens, per-token timesteps, normalised positions,
    and (LTX-2.5) its tokens' keyframe marker, cut as upstream's modality tiling cuts it."""
    timesteps = sampling.timesteps_from_mask(mask, sigma)[..., 0]
    out = []
    for tokens in sets:
        cut = cut_tile_inputs(latent, timesteps, positions, tokens)
        out.append({"latent": cut.latent, "timesteps": cut.timesteps, "positions": cut.positions.astype(F32)})
        if marker is not None:
            out[-1]["keyframes"] = np.ascontiguousarray(marker[:, tokens.keep_indices], dtype=F32)
    return out


def reduce_step(latent: np.ndarray, clean: np.ndarray, mask: np.ndarray, positions: np.ndarray,
                velocities: list[np.ndarray], sets: list[TileTokens], sigmas: list[float], step: int,
                ancestral: tuple[float, int] | None = None) -> np.ndarray:
    """Blend the tile velocities (mask × output, summed in tile order) and take the Euler step; with
    `ancestral` (eta, seed) the Euler-ancestral step, its re-noise keyed as the untiled stage keys it."""
    masked = [masked_tile_output(tokens, v) for tokens, v in zip(sets, velocities, strict=True)]
    velocity = reduce_masked_outputs(latent.shape, sets, masked)
    state = sampling.LatentState(latent=latent, denoise_mask=mask, clean_latent=clean, positions=positions)
    sigma = float(sigmas[step])
    x0 = sampling.x0_from_velocity(latent, velocity, sampling.timesteps_from_mask(mask, sigma))
    if ancestral is None:
        return sampling.denoise_step(state, x0, sigmas, step).latent
    eta, seed = ancestral
    fresh = None
    if float(sigmas[step + 1]) != 0:
        fresh = sampling.noise(latent.shape, seed, sampling.stream_id(sampling.STREAM_VIDEO_ANCESTRAL, step))
    return sampling.ancestral_denoise_step(state, x0, sigmas, step, eta, fresh).latent


def step_ancestral(params: dict) -> tuple[float, int] | None:
    """A tiled step's (eta, re-noise seed) from its params (`coordinator/plan/samplers.py`), None for Euler."""
    if params.get("sampler", sampling.EULER) == sampling.EULER:
        return None
    if params["sampler"] != sampling.EULER_ANCESTRAL:
        raise ValueError(f"unknown sampler {params['sampler']!r}")
    offset = int(params.get("ancestral_offset", sampling.ANCESTRAL_NOISE_SEED_OFFSET))
    return sampling.STAGE1_ANCESTRAL_ETA, int(params["seed"]) + offset
