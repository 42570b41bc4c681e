"""Retake: regenerate a time window of a source clip, every token outside it pinned. Pure numpy.

Upstream's `TemporalRegionMask` (ltx-pipelines 1.0.0 `retake.py`, later moved into ltx-core) sets the
denoise mask of a state from its tokens' time bounds: 1 where `[t_start, t_end)` overlaps the window
`[start, end)` seconds (`t_end > start and t_start < end`), else 0. Video bounds are the patch grid's
pixel bounds after the causal fix over fps (latent frame 0 spans pixel frames [0, 1), latent k >= 1
spans [8k - 7, 8k + 1)); audio bounds are the audio patchifier's seconds (25 latents a second, causal).
The states start from the source's encoded latents as clean (`initial_video` / `initial_audio`), so a
mask-0 token is noised to exactly its clean value and every Euler step keeps it there: the frames
outside the window come out bit-identical to the source's latents. Without `regen_audio` the audio
window is empty (upstream passes start = end = 0), so every audio token stays the source's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ltx_engine.rules import sampling
from ltx_engine.rules.sampling import LatentState

F32 = np.float32
AUDIO_RATE, AUDIO_HOP, AUDIO_DOWNSAMPLE = 16000, 160, 4


class RetakeError(ValueError):
    """A window the source cannot take (one line, for the submit-time check)."""


@dataclass(frozen=True)
class RetakeWindow:
    """`[start, end)` seconds of the source to regenerate; `regen_audio` False keeps all its audio."""

    start: float
    end: float
    regen_audio: bool = True

    def check(self, duration: float) -> RetakeWindow:
        """The window, refused when empty, negative or past the source's `duration` seconds."""
        if not (np.isfinite(self.start) and np.isfinite(self.end)):
            raise RetakeError(f"--start {self.start} / --end {self.end}: not finite")
        if self.start < 0 or self.start >= self.end:
            raise RetakeError(f"--start {self.start} must be >= 0 and below --end {self.end}")
        if self.end > duration + 1e-6:
            raise RetakeError(f"--end {self.end} is past the source's {duration:.3f} s")
        return self

    @property
    def audio_window(self) -> tuple[float, float]:
        return (self.start, self.end) if self.regen_audio else (0.0, 0.0)


def _overlap(t_start: np.ndarray, t_end: np.ndarray, start: float, end: float) -> np.ndarray:
    return ((t_end > F32(start)) & (t_start < F32(end))).astype(F32)


def video_time_bounds(grid: tuple[int, int, int], fps: float) -> np.ndarray:
    """(T, 2) float32 seconds [start, end) of each video token (token order f, h, w)."""
    f, h, w = grid
    k = np.arange(f, dtype=F32)
    start, end = np.maximum(k * 8 + 1 - 8, 0), np.maximum((k + 1) * 8 + 1 - 8, 0)  # causal fix
    per_frame = np.stack([start, end], axis=-1).astype(F32) / F32(fps)
    return np.repeat(per_frame, h * w, axis=0)


def audio_time_bounds(frames: int) -> np.ndarray:
    """(T, 2) float32 seconds of each audio latent frame (upstream's causal AudioPatchifier)."""
    idx = np.arange(frames + 1, dtype=F32) * F32(AUDIO_DOWNSAMPLE)
    mel = np.maximum(idx + 1 - AUDIO_DOWNSAMPLE, 0).astype(F32)
    sec = (mel * F32(AUDIO_HOP) / F32(AUDIO_RATE)).astype(F32)
    return np.stack([sec[:-1], sec[1:]], axis=-1)


def video_window_mask(grid: tuple[int, int, int], fps: float, start: float, end: float) -> np.ndarray:
    """(1, F*h*w, 1) denoise mask: 1 on tokens whose time overlaps [start, end), else 0."""
    bounds = video_time_bounds(grid, fps)
    return _overlap(bounds[:, 0], bounds[:, 1], start, end)[None, :, None]


def audio_window_mask(frames: int, start: float, end: float) -> np.ndarray:
    """(1, frames, 1) denoise mask of the audio tokens overlapping [start, end)."""
    bounds = audio_time_bounds(frames)
    return _overlap(bounds[:, 0], bounds[:, 1], start, end)[None, :, None]


def window_latent_frames(frames: int, fps: float, start: float, end: float) -> list[int]:
    """The latent frames a window regenerates, for a clip of `frames` pixel frames (what a planner shows
    and what the decode must cover)."""
    bounds = video_time_bounds(((frames - 1) // 8 + 1, 1, 1), fps)
    return [k for k, m in enumerate(_overlap(bounds[:, 0], bounds[:, 1], start, end)) if m]


def retake_states(
    video_clean: np.ndarray,
    audio_clean: np.ndarray | None,
    window: RetakeWindow,
    grid: tuple[int, int, int],
    fps: float,
    positions: tuple[np.ndarray, np.ndarray],
) -> tuple[LatentState, LatentState | None]:
    """Un-noised stage states from the source's patchified latents (video (1, T, C), audio (1, A, C*M)
    or None: no source audio, generated whole) with the window's masks applied."""
    vpos, apos = positions
    video = LatentState.initial(video_clean, vpos)
    video = LatentState(
        video.latent,
        video_window_mask(grid, fps, window.start, window.end),
        video.clean_latent,
        video.positions,
    )
    if audio_clean is None:
        return video, None
    audio = LatentState.initial(audio_clean, apos)
    mask = audio_window_mask(audio.num_tokens, *window.audio_window)
    return video, LatentState(audio.latent, mask, audio.clean_latent, audio.positions)


def noised(state: LatentState, seed: int, stream: int, sigma0: float) -> LatentState:
    """The state noised at sigma0 from the stage's named Philox stream (mask-0 tokens stay clean exactly)."""
    return state.noised(sampling.noise(state.latent.shape, seed, stream), sigma0)


def audio_frames_for(frames: int, fps: float) -> int:
    """Audio latents of a clip (upstream `AudioLatentShape.from_video_pixel_shape`: round(s * 25))."""
    return round(frames / fps * AUDIO_RATE / AUDIO_HOP / AUDIO_DOWNSAMPLE)


def fit_audio(latent: np.ndarray, frames: int) -> np.ndarray:
    """The source's audio latent (1, C, T, M) cut or zero-padded to `frames` latents, as upstream's
    `_encode_audio_for_retake` fits it to the clip."""
    t = latent.shape[2]
    if t >= frames:
        return np.ascontiguousarray(latent[:, :, :frames])
    pad = np.zeros((*latent.shape[:2], frames - t, latent.shape[3]), latent.dtype)
    return np.concatenate([latent, pad], axis=2)
