"""Conditioning a stage's video state on several images (or multi-frame latents), as upstream does.

Each condition is (latent (1, C, F, h, w), pixel frame, strength, binding):
- `replace` (upstream `VideoConditionByLatentIndex`): the latent's tokens overwrite the generated
  tokens of the latent frames it covers, from the latent frame the pixel frame starts (frame 0, or
  1 + 8k -> latent k + 1 under the causal VAE; any other frame is refused), mask 1 - strength.
- `guide` (upstream `VideoConditionByKeyframeIndex`): the tokens are appended, positioned at the pixel
  frame (causal fix only at frame 0; a latent of one pixel frame spans [t, t + 1), as upstream since
  `num_pixel_frames`), mask 1 - strength, never marked as keyframes.
- `auto` (upstream `ImageConditioningInput.at`, the MLX port's default): frame 0 replaces, any other
  index guides, decided from the index as written (a negative index always guides).
A frame index may be negative (from the end, -1 = the last frame) or `last`; it is resolved against
the stage's pixel frame count. Conditions apply in the given order, replaces in place, guides appended
after the generated tokens (before DFR slots and an IC-LoRA reference).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ltx_engine.models import patchify
from ltx_engine.rules.keyframes import (  # noqa: F401 - the pure rules, part of this module's surface
    AUTO,
    BINDINGS,
    GUIDE,
    LAST,
    REPLACE,
    ConditioningError,
    binding_for,
    replacement_latent_index,
    resolve_frame,
)
from ltx_engine.rules.sampling import LatentState
from ltx_engine.rules.tokens import patchify_video

F32 = np.float32


@dataclass(frozen=True)
class ImageCondition:
    """One image (or latent clip) to condition on. `frame`: pixel index, negative from the end, or "last"."""

    latent: np.ndarray
    frame: int | str
    strength: float = 1.0
    binding: str = AUTO
    name: str = "image"


def binding_of(condition: ImageCondition) -> str:
    """`replace` or `guide`; `auto` decides from the index as written: frame 0 replaces."""
    return binding_for(condition.binding, condition.frame, condition.name)


def guide_positions(grid: tuple[int, int, int], pixel_frame: int, fps: float, num_pixel_frames: int = 1) -> np.ndarray:
    """(1, 3, F*h*w, 2) positions of appended guide tokens of an (F, h, w) latent at `pixel_frame`."""
    f, h, w = grid
    if f == 1:
        return np.array(patchify.keyframe_positions(1, pixel_frame, h, w, fps, num_pixel_frames), dtype=F32)
    coords = patchify.video_latent_coords(1, f, h, w)
    px = patchify.pixel_coords(coords, causal_fix=pixel_frame == 0).astype(F32)
    px[:, 0] += F32(pixel_frame)
    if num_pixel_frames == 1:
        px[:, 0, :, 1] = px[:, 0, :, 0] + F32(1.0)
    px[:, 0] = px[:, 0] / F32(fps)
    return px


def _replace(video: LatentState, cond: ImageCondition, frame: int, grid: tuple[int, int, int]) -> tuple[LatentState, range]:
    f_total, h, w = grid
    latent = np.asarray(cond.latent, F32)
    start = replacement_latent_index(frame, cond.name)
    frames = range(start, start + latent.shape[2])
    if tuple(latent.shape[3:]) != (h, w) or frames.stop > f_total:
        raise ConditioningError(f"{cond.name}: latent {tuple(latent.shape[2:])} at latent frame {start} does not fit "
                                f"the stage's latent grid {grid}")
    return video.replace_tokens(start * h * w, patchify_video(latent), cond.strength), frames


def _guide(video: LatentState, cond: ImageCondition, frame: int, grid: tuple[int, int, int], fps: float) -> LatentState:
    latent = np.asarray(cond.latent, F32)
    f, h, w = latent.shape[2:]
    if (h, w) != grid[1:]:
        raise ConditioningError(f"{cond.name}: latent {h}x{w} does not match the stage's {grid[1]}x{grid[2]}")
    pixel_frames = 1 if f == 1 else (f - 1) * 8 + 1
    return video.append_tokens(patchify_video(latent), guide_positions((f, h, w), frame, fps, pixel_frames), cond.strength)


def apply_image_conditions(video: LatentState, conditions: Sequence[ImageCondition], grid: tuple[int, int, int],
                           frames: int, fps: float) -> LatentState:
    """`video` (the stage's generated tokens, latent `grid` (F, h, w), `frames` pixel frames) with every
    condition applied in order. Two replaces on one latent frame are refused."""
    replaced: dict[int, str] = {}
    for cond in conditions:
        frame = resolve_frame(cond.frame, frames, cond.name)
        if binding_of(cond) == GUIDE:
            video = _guide(video, cond, frame, grid, fps)
            continue
        video, covered = _replace(video, cond, frame, grid)
        for k in covered:
            if k in replaced:
                raise ConditioningError(f"{cond.name}: replaces latent frame {k}, which {replaced[k]} replaces too")
            replaced[k] = cond.name
    return video


def appended_tokens(conditions: Sequence[ImageCondition], grid: tuple[int, int, int]) -> int:
    """How many tokens the guides of `conditions` append after the generated ones (what a planner
    adds to find the DFR slots and the IC-LoRA reference behind them)."""
    h, w = grid[1:]
    return sum(int(np.shape(c.latent)[2]) * h * w for c in conditions if binding_of(c) == GUIDE)
