"""DFR's spatial epilogue after temporal rounds: its temporal windows, each pinned on the previous one.
Pure python/numpy.

Upstream (`dfr_stages._plan_epilogue_windows`, `_prepare_epilogue_window_specs`, `_run_epilogue_windows`,
`dfr_helpers.tile_prefix` / `lead_in_carryover` / `audio_latent_for_tile`; absent from ltx-core 1.0.0):
one window per tile of the last temporal round (the whole canvas at 0 rounds), run one after another. A
non-first window starts on the carried keyframe plane at the last plane position before its seam
(`TilePrefix`, `dfr_layout.tile_prefix`: the round tiles' rule too): cell 0 is that plane (rebuilt at full size), cells 1 .. (seam - plane) / 8 are the
previous window's finished output up to the seam, pinned at strength 1 (a `replace` at frame 0, mask 0),
and only the cells after the seam are kept. A window is conditioned on the carried planes at or after
its resume frame (strength 1, window-local frames), the opening plane (first window only), the IC-LoRA
reference cut from the pre-upsample latent over the same cells, and stage 1's audio resampled onto its
time range (frozen). The windows' kept cells concatenate to the canvas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ltx_engine.rules.dfr_layout import TEMPORAL_SCALE, DfrPlan, carried_cells, tile_prefix

F32 = np.float32
AUDIO_LATENTS_PER_SECOND = 25.0


@dataclass(frozen=True)
class Window:
    """One epilogue window on the final canvas. `start`/`end`: the canvas cells it denoises (end
    exclusive); `plane`: the pixel frame of its cell-0 plane (None: the first window, cell 0 = canvas
    cell `start`); `pinned`: cells handed over (the plane included); `resume`: first pixel frame it
    denoises; `origin`: the canvas pixel frame of its cell 0."""

    index: int
    start: int
    end: int
    plane: int | None
    pinned: int
    resume: int

    @property
    def origin(self) -> int:
        return self.plane if self.plane is not None else self.start * TEMPORAL_SCALE

    @property
    def video_start(self) -> int:
        """First canvas cell of the window's video run (after the plane, when it has one)."""
        return self.plane // TEMPORAL_SCALE + 1 if self.plane is not None else self.start

    @property
    def cells(self) -> int:
        return self.end - self.video_start + (1 if self.plane is not None else 0)

    @property
    def local_frames(self) -> int:
        return (self.cells - 1) * TEMPORAL_SCALE + 1

    @property
    def base_cell(self) -> int:
        """The canvas cell its cell 0 stands for (upstream's `previous[0]`)."""
        return self.video_start - 1 if self.plane is not None else self.start


def plan_windows(plan: DfrPlan) -> tuple[Window, ...]:
    """The epilogue's windows: one per tile of the last round (its owned cells: the cell after its seam
    on), or the whole canvas at 0 rounds."""
    if not plan.rounds:
        return (Window(0, 0, plan.canvas.latent_frames, None, 0, 0),)
    last = plan.rounds[-1]
    out = []
    for tile in last.tiles:
        if tile.index == 0:
            out.append(Window(0, 0, tile.latent_end, None, 0, 0))
            continue
        seam = (tile.latent_start + tile.drop_latent_prefix - 1) * TEMPORAL_SCALE
        plane, pinned = tile_prefix(seam, last.carry())
        out.append(Window(tile.index, seam // TEMPORAL_SCALE + 1, tile.latent_end, plane, pinned, seam + 1))
    return tuple(out)


def window_planes(window: Window, positions: Sequence[int], pixel_end: int) -> list[tuple[int, int]]:
    """(index into `positions`, window-local frame) of the carried planes conditioning the window:
    inside [origin, its last frame] and at or after its resume frame."""
    last = min(pixel_end, window.origin + window.local_frames - 1)
    return [
        (i, int(p) - window.origin)
        for i, p in enumerate(positions)
        if window.origin <= p <= last and p >= window.resume
    ]


def window_latent(up: np.ndarray, window: Window, plane: np.ndarray | None) -> np.ndarray:
    """The window's starting latent: the upsampled canvas over its cells, its plane first if it has one."""
    video = up[:, :, window.video_start : window.end]
    return video if window.plane is None else np.concatenate([plane.astype(up.dtype), video], axis=2)


def window_reference(guide: np.ndarray, window: Window) -> np.ndarray:
    """The IC-LoRA reference: the pre-upsample latent over the cells the window stands for."""
    return guide[:, :, window.base_cell : window.end]


def carried_prefix(
    previous: np.ndarray, previous_window: Window, window: Window, plane: np.ndarray
) -> np.ndarray:
    """The pinned prefix (upstream `lead_in_carryover`, `dfr_layout.carried_cells` as the round tiles'):
    the plane, then the previous window's output from the canvas cell after the plane up to the seam."""
    return carried_cells(previous, previous_window.base_cell, plane, window.video_start - 1, window.pinned)


def resample_audio_time(audio: np.ndarray, start: float, end: float, frames: int) -> np.ndarray:
    """`audio` (B, C, T, M) sampled linearly along T over [start, end) cells at `frames` points."""
    if frames < 1 or end <= start or audio.shape[2] < 1:
        raise ValueError(f"cannot resample {audio.shape} over [{start}, {end}) to {frames} frames")
    full = audio.shape[2]
    pos = np.clip(
        np.float32(start) + np.float32((end - start) / frames) * np.arange(frames, dtype=F32), 0, full - 1
    )
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, full - 1)
    weight = (pos - lo.astype(F32)).astype(audio.dtype).reshape(1, 1, -1, 1)
    return audio[:, :, lo] * (1 - weight) + audio[:, :, hi] * weight


def audio_frames(frames: int, fps: float) -> int:
    """Audio latent cells for `frames` pixel frames at `fps` (25 per second)."""
    return round(frames / fps * AUDIO_LATENTS_PER_SECOND)


def window_audio(
    audio: np.ndarray, window: Window, playback_fps: float, source_seconds: float, cond_fps: float
) -> np.ndarray:
    """Stage 1's audio over the window's playback time, resampled to its token count (upstream
    `audio_latent_for_tile`: wall-clock bounds as a fraction of stage 1's duration)."""
    full = audio.shape[2]
    start = window.origin / playback_fps / source_seconds * full
    end = (window.origin + window.local_frames) / playback_fps / source_seconds * full
    return np.ascontiguousarray(
        resample_audio_time(audio, start, end, audio_frames(window.local_frames, cond_fps))
    )


def join_windows(latents: Sequence[np.ndarray], windows: Sequence[Window]) -> np.ndarray:
    """The canvas latent: each window's output from its pinned cells on, in order."""
    return np.concatenate([lat[:, :, w.pinned :] for lat, w in zip(latents, windows, strict=True)], axis=2)
