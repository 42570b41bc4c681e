"""One DFR temporal tile on a worker: its latent state (image guide, anchors, new keyframe slots) and
its Euler-ancestral loop. The layout (which frames, anchors, slots, seeds) comes from `dfr_layout`.

A tile is denoised as its own short clip: its first latent frame is a single pixel frame (marked for
LTX-2.5's keyframe embedding, as the reference marks every state's first frame); a non-first tile's
first cells are its pinned prefix (upstream's `TilePrefix`: the plane before its seam, then the
previous tile's output up to the seam, strength 1); carried keyframes after them are appended as single-frame conditioning tokens at strength 0.95, and new slots at
the segment midpoints are appended as generated single-frame tokens (marked, seeded from the nearest
latent frame). As upstream, the tile runs video only (no audio stream). Everything
here is numpy float32 except the transformer call, and every draw of noise is keyed by the tile's own
seed, so a tile computes the same bytes on any worker and in `farm render --local`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ltx_engine.models import patchify
from ltx_engine.rules import sampling
from ltx_engine.rules.dfr_layout import (  # noqa: F401
    TEMPORAL_SCALE,
    DfrTile,
    RoundPlan,
    round_tile_prefix,
    tile_image_frame,
)
from ltx_engine.rules.sampling import F32, LatentState, lerp_noise
from ltx_engine.rules.tokens import patchify_video, unpatchify_video


@dataclass
class DfrTileInputs:
    """What a DFR tile reads: the round's whole upsampled latent, the keyframes carried into the round
    (one per seam of `plan`, in seam order), the text contexts and the render's image latent (full
    resolution, placed at `image_frame`); all numpy."""

    latent: np.ndarray
    carry: np.ndarray
    contexts: dict[str, np.ndarray]
    plan: RoundPlan
    tile: DfrTile
    image_latent: np.ndarray | None = None
    image_frame: int = 0
    image_strength: float = 1.0
    images: tuple[tuple[np.ndarray, int, float], ...] = ()  # further images (latent, pixel frame, strength)
    previous: np.ndarray | None = None  # a non-first tile: the tile before it (window latent, new slots),
    previous_slots: np.ndarray | None = None  # its pinned prefix's source (`dfr_layout.round_tile_prefix`)

    def prefix(self) -> np.ndarray | None:
        """The tile's pinned prefix (upstream's `TilePrefix`); None for a round's first tile."""
        return round_tile_prefix(self.plan, self.tile, self.previous, self.previous_slots, self.carry)


@dataclass(frozen=True)
class TileState:
    """A tile's noised video state plus what the loop and the extraction need to know about it."""

    state: LatentState
    keyframes_mask: np.ndarray  # (1, T, 1): 1 on single-pixel-frame generated tokens
    grid: tuple[int, int, int]  # the tile's latent grid (frames, height, width)
    slot_start: int             # first token of the new slots
    num_slots: int


@dataclass
class TileTokens:
    """Token segments in append order: pre-noise latent, clean latent, mask, positions, marker."""

    init: list[np.ndarray]
    clean: list[np.ndarray]
    mask: list[np.ndarray]
    positions: list[np.ndarray]
    marked: list[np.ndarray]

    def add(self, init: np.ndarray, clean: np.ndarray, mask: float, positions: np.ndarray,
            marked: bool | np.ndarray) -> None:
        n = init.shape[1]
        self.init.append(init.astype(F32))
        self.clean.append(clean.astype(F32))
        self.mask.append(np.full((1, n, 1), F32(mask), F32))
        self.positions.append(np.asarray(positions, F32))
        self.marked.append(np.broadcast_to(np.asarray(marked, F32), (1, n, 1)).astype(F32))

    def joined(self) -> tuple[np.ndarray, ...]:
        """(init, clean, mask, positions, marked), tokens concatenated in append order."""
        tokens = [np.concatenate(p, axis=1) for p in (self.init, self.clean, self.mask)]
        return (*tokens, np.concatenate(self.positions, axis=2), np.concatenate(self.marked, axis=1))


def _slot_seeds(tile_video: np.ndarray, local_slots: Sequence[int]) -> np.ndarray:
    """The latent frame nearest each slot's pixel frame, (1, C, K, H, W): the slots' starting content."""
    last = tile_video.shape[2] - 1
    index = [min(max(round(p / TEMPORAL_SCALE), 0), last) for p in local_slots]
    return tile_video[:, :, index]


def _frame_positions(frame: int, h: int, w: int, fps: float) -> np.ndarray:
    return np.array(patchify.keyframe_positions(1, frame, h, w, fps), dtype=F32)


def _condition_on_image(tokens: TileTokens, image: tuple[np.ndarray, int, float], tile: DfrTile,
                        hw: tuple[int, int], fps: float) -> None:
    """Image guidance in a tile (upstream's combined_image_conditionings): at local frame 0 it replaces
    the window's first latent frame (mask 1 - strength), elsewhere it is an unmarked appended guide."""
    latent, frame, strength = image
    local = tile_image_frame(tile, frame)
    if local is None:
        return
    h, w = hw
    kf = patchify_video(np.asarray(latent, F32))
    if local == 0:
        tokens.init[0][:, : h * w] = kf
        tokens.clean[0][:, : h * w] = kf
        tokens.mask[0][:, : h * w] = F32(1.0) - F32(strength)
        return
    tokens.add(np.zeros_like(kf), kf, 1.0 - strength, _frame_positions(local, h, w, fps), False)


def _pin_prefix(tokens: TileTokens, prefix: np.ndarray, tile: DfrTile, hw: tuple[int, int]) -> None:
    """Upstream's `TilePrefix`: the tile's first `pinned` latent frames replaced by the prefix at
    strength 1 (mask 0), so they stay the previous tile's cells at every step."""
    if prefix.shape[2] != tile.pinned:
        raise ValueError(f"tile {tile.index} pins {tile.pinned} cells, got a prefix of {prefix.shape[2]}")
    n = tile.pinned * hw[0] * hw[1]
    cells = patchify_video(np.asarray(prefix, F32))
    tokens.init[0][:, :n] = cells
    tokens.clean[0][:, :n] = cells
    tokens.mask[0][:, :n] = F32(0.0)


def build_tile_state(latent: np.ndarray, tile: DfrTile, plan: RoundPlan, carry: np.ndarray,
                     carry_positions: Sequence[int], image: tuple[np.ndarray, int, float] | None = None,
                     images: Sequence[tuple[np.ndarray, int, float]] = (),
                     prefix: np.ndarray | None = None) -> tuple[TileTokens, tuple[int, int, int]]:
    """The tile's tokens before noising: generated window (its pinned prefix first, when it has one),
    the image guides (`image`, then `images`, each re-attached where it falls in the frames it
    denoises), anchors, then new slots."""
    tile_video = np.asarray(latent[:, :, tile.latent_start : tile.latent_end], F32)
    grid = tuple(int(n) for n in tile_video.shape[2:])
    f, h, w = grid
    fps = plan.conditioning_fps
    tokens = TileTokens([], [], [], [], [])
    video = patchify_video(tile_video)
    first_frame = np.zeros((1, video.shape[1], 1), F32)
    first_frame[:, : h * w] = 1.0  # the tile's first latent frame encodes one pixel frame
    tokens.add(video, video, 1.0, np.array(patchify.video_positions(1, f, h, w, fps), F32), first_frame)
    if tile.pinned:
        if prefix is None:
            raise ValueError(f"tile {tile.index} pins {tile.pinned} cells on the tile before it: give its prefix")
        _pin_prefix(tokens, prefix, tile, (h, w))
    for one in ((image,) if image is not None else ()) + tuple(images):
        _condition_on_image(tokens, one, tile, (h, w), fps)
    index = {int(p): i for i, p in enumerate(carry_positions)}
    for global_p, local_p in zip(tile.anchors, tile.local_anchors, strict=True):
        if global_p not in index:
            raise ValueError(f"anchor at frame {global_p} is not among the carried keyframes {list(carry_positions)}")
        kf = patchify_video(np.asarray(carry[:, :, index[global_p] : index[global_p] + 1], F32))
        tokens.add(np.zeros_like(kf), kf, 1.0 - plan.anchor_strength, _frame_positions(local_p, h, w, fps), False)
    seeds = _slot_seeds(tile_video, tile.local_slots)
    for k, local_p in enumerate(tile.local_slots):
        seed = patchify_video(seeds[:, :, k : k + 1])
        tokens.add(seed, np.zeros_like(seed), 1.0, _frame_positions(local_p, h, w, fps), True)
    return tokens, grid


def noised_tile_state(latent: np.ndarray, tile: DfrTile, plan: RoundPlan, carry: np.ndarray,
                      carry_positions: Sequence[int], image: tuple[np.ndarray, int, float] | None = None,
                      images: Sequence[tuple[np.ndarray, int, float]] = (),
                      prefix: np.ndarray | None = None) -> TileState:
    """The tile's state noised to the first temporal sigma with noise keyed by the tile's seed."""
    tokens, grid = build_tile_state(latent, tile, plan, carry, carry_positions, image, images, prefix)
    init, clean, mask, positions, marked = tokens.joined()
    noise = sampling.noise(init.shape, tile.noise_seed, sampling.stream_id(sampling.STREAM_VIDEO))
    state = LatentState(lerp_noise(init, clean, noise, plan.sigmas[0], mask), mask, clean, positions)
    n_slots = len(tile.slots)
    slot_start = state.num_tokens - n_slots * grid[1] * grid[2]
    return TileState(state, marked, grid, slot_start, n_slots)


Forward = Callable[[LatentState, np.ndarray, float], np.ndarray]


def run_tile_loop(tile_state: TileState, plan: RoundPlan, seed: int, forward: Forward,
                  progress: Callable[[int, int], None] | None = None) -> LatentState:
    """Euler-ancestral over the temporal sigmas; the re-noise of step i is keyed (seed, step i)."""
    state, sigmas = tile_state.state, [float(s) for s in plan.sigmas]
    steps = len(sigmas) - 1
    for step in range(steps):
        sigma = sigmas[step]
        velocity = forward(state, tile_state.keyframes_mask, sigma)
        x0 = sampling.x0_from_velocity(state.latent, velocity, sampling.timesteps_from_mask(state.denoise_mask, sigma))
        stream = sampling.stream_id(sampling.STREAM_VIDEO_ANCESTRAL, step)
        fresh = sampling.noise(state.latent.shape, seed, stream) if sigmas[step + 1] != 0 else None
        state = sampling.ancestral_denoise_step(state, x0, sigmas, step, plan.eta, fresh)
        if progress is not None:
            progress(step + 1, steps)
    return state


def tile_outputs(final: LatentState, tile_state: TileState) -> dict[str, np.ndarray]:
    """The tile's whole window latent (the stitch drops its lead-in) and its new slots (B, C, K, H, W)."""
    f, h, w = tile_state.grid
    window = unpatchify_video(final.latent[:, : f * h * w], (f, h, w))
    stop = tile_state.slot_start + tile_state.num_slots * h * w
    slots = unpatchify_video(final.latent[:, tile_state.slot_start : stop], (tile_state.num_slots, h, w))
    return {"latent": window.astype(F32), "slots": slots.astype(F32)}


def model_forward(model, contexts: dict[str, np.ndarray]) -> Forward:
    """A Forward over an LTX model: video only at sigma with its keyframe marker (upstream runs the
    temporal rounds with no audio stream)."""
    from ltx_engine.models.transformer import Modality

    mask = contexts.get("context_mask")
    ctx_mask = None if mask is None else mx.array(mask)

    def forward(video: LatentState, marker: np.ndarray, sigma: float) -> np.ndarray:
        v = Modality(latent=mx.array(video.latent), sigma=mx.array(np.full((1,), sigma, F32)),
                     timesteps=mx.array(sampling.timesteps_from_mask(video.denoise_mask, sigma)[..., 0]),
                     positions=mx.array(video.positions), context=mx.array(contexts["video_context"]),
                     context_mask=ctx_mask, keyframes_mask=mx.array(marker))
        v_out, _ = model(v, None)
        return np.array(v_out.astype(mx.float32))

    return forward
