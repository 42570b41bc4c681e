"""Chunked renders: a clip longer than one window, made of overlapping windows. Pure arithmetic, no model.

Upstream's `ltx_pipelines.chunks` (its 1.4.0 CHANGELOG: `--chunked`, `--chunk-pixel-frames` 97,
`--chunk-carry-frames` 25, `--chunk-blend-frames`) is not readable here; this follows its description
and the extend recipe's rules (`ltx_engine.rules.extend`): window k + 1 re-encodes window k's last
`carry` decoded frames as a clip of its own (8k + 1 frames under the causal VAE) and pins them (replace,
strength 1) at its latent index 0, with their audio, round(carry / fps * 25) latents, pinned at the start
of its audio. Each window adds `frames - carry` new frames, so window k starts at k (window - carry).
The decoded windows are joined by a crossfade over the last `blend` frames of each overlap (window k's
frames before it, window k + 1's after), and the audio latents are joined once (window 0's, then each
later window's after its pinned part) and decoded once, so the track has no seam of its own.

`latent` carry (ours, not upstream's): window k + 1 pins window k's last (carry - 1) / 8 + 1 latent frames
themselves, at half size from its stage 1 and at full size from its stage 2, so its stage 1 waits for
window k's stage 1 alone. Those latents span carry + 7 of window k's frames; pinned at latent 0, the
first of them stands for one frame (the causal VAE's lone first frame), so the window's frames keep the
decoded carry's places and the seam's crossfade hides the 7 frames that first latent folds into one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PIXEL_FRAMES = 97  # upstream's window
CARRY_FRAMES = 25  # upstream's carry: extend's 25 boundary frames
BLEND_FRAMES = 8  # ours: one latent frame's span of the carry (docs/parity.md)
AUDIO_LATENTS_PER_SECOND = 25.0
CARRIES = ("decoded", "latent")  # upstream's decoded frames re-encoded; ours: the stage latents themselves


class ChunkError(ValueError):
    """A chunked render the windows cannot be laid out for (one line)."""


def audio_latents(frames: int, fps: float) -> int:
    """Audio latents of `frames` pixel frames (the planner's `audio_latent_frames` rule)."""
    return round(frames / fps * AUDIO_LATENTS_PER_SECOND)


def _eight_k_plus_one(n: int) -> bool:
    return n >= 1 and (n - 1) % 8 == 0


@dataclass(frozen=True, slots=True)
class Window:
    """One window: its first frame in the joined clip, its pixel frames (8k + 1), and how many of its first
    frames are the previous window's carried ones (0 for the first window)."""

    index: int
    start: int
    frames: int
    carry: int

    @property
    def stop(self) -> int:
        return self.start + self.frames


@dataclass(frozen=True, slots=True)
class ChunkLayout:
    """The windows of a `total`-frame clip at `fps`, each at most `window` frames, carrying `carry`."""

    total: int
    window: int = PIXEL_FRAMES
    carry: int = CARRY_FRAMES
    blend: int = BLEND_FRAMES
    fps: float = 24.0

    def __post_init__(self) -> None:
        problem = layout_problem(self.total, self.window, self.carry, self.blend)
        if problem:
            raise ChunkError(problem)

    @property
    def windows(self) -> tuple[Window, ...]:
        """Window 0 at frame 0; each next one starts `carry` frames before the last one ends, the last one
        cut to the clip's end (still 8k + 1 frames and longer than the carry: the clip's length is 8k + 1)."""
        out = [Window(0, 0, self.window, 0)]
        while out[-1].stop < self.total:
            start = out[-1].stop - self.carry
            out.append(Window(len(out), start, min(self.window, self.total - start), self.carry))
        return tuple(out)

    @property
    def carry_latents(self) -> int:
        """Latent frames of the carry (a clip of its own under the causal VAE): what a latent carry pins."""
        return (self.carry - 1) // 8 + 1

    @property
    def carry_audio(self) -> int:
        """Audio latents each later window pins at its start (the carry's, as extend's context)."""
        return audio_latents(self.carry, self.fps)

    def audio_frames(self, window: Window) -> int:
        return audio_latents(window.frames, self.fps)

    def carry_audio_slice(self, window: Window) -> slice:
        """The latents of `window`'s audio the next window pins: its last `carry_audio`."""
        n = self.audio_frames(window)
        return slice(n - min(self.carry_audio, n), n)

    def source_frames(self, window: Window) -> tuple[int, int]:
        """[start, stop) frames of a long source (an A2V track, an IC-LoRA control clip, a Dub-It reference,
        counted from where the clip starts in it) that `window` is made to: its own frames', so each window's
        slice is the source's own and the slices meet at every seam (the carried prefix included: the window
        re-makes those frames to the same source)."""
        return window.start, window.stop

    def track_window(self, window: Window) -> tuple[float, float]:
        """[start, stop) seconds of a track (from its start) that `window` is made to: `source_frames`."""
        start, stop = self.source_frames(window)
        return start / self.fps, stop / self.fps

    def place(self, frame: int) -> tuple[int, int]:
        """(window index, frame in that window) of the clip's `frame`: the first window that has it. A frame
        in a later window's carried prefix belongs to the window before, which generates it; the later
        window re-pins it with the carry (so a keyframe there is applied once, where the frame is made).
        Window starts are multiples of 8, so a frame on a latent frame's first pixel stays on one."""
        if not 0 <= frame < self.total:
            raise ChunkError(f"frame {frame} is outside the clip's 0..{self.total - 1}")
        window = next(w for w in self.windows if w.start <= frame < w.stop)
        return window.index, frame - window.start

    def blend_span(self, window: Window) -> tuple[int, int]:
        """[start, stop) frames of the joined clip crossfaded into `window` (empty for window 0): the last
        `blend` frames of its overlap with the window before."""
        if window.index == 0:
            return window.start, window.start
        stop = window.start + window.carry
        return stop - self.blend, stop


    def final_frames(self, decoded: int) -> int:
        """Frames of the joined clip that are final once windows [0, decoded) are decoded: window k's
        last `blend` frames wait for window k + 1's crossfade, so they are final only with it (the last
        window's are final as they come). What a render's growing film holds."""
        windows = self.windows
        if decoded <= 0:
            return 0
        if decoded >= len(windows):
            return self.total
        return windows[decoded - 1].stop - self.blend


def layout_problem(total: int, window: int, carry: int, blend: int) -> str | None:
    """Why these numbers lay out no windows (the one line a submit refuses with), else None."""
    if not _eight_k_plus_one(window):
        return f"--chunk-pixel-frames {window} is not of the form 8k+1 (e.g. 97)"
    if not _eight_k_plus_one(carry):
        return f"--chunk-carry-frames {carry} is not of the form 8k+1 (e.g. 25)"
    if carry >= window:
        return f"--chunk-carry-frames {carry} is not shorter than the window's {window} frames"
    most = min(carry - 1, window - carry)  # inside the carry after its first frame, before the next seam
    if not 0 <= blend <= most:
        return f"--chunk-blend-frames {blend}: 0 to {most} (inside the carried frames, after the first)"
    if total <= window:
        return f"--chunked: {total} frames fit one window of {window}: give -f above it, or drop --chunked"
    return None


def seam_weight(position: int, blend: int) -> float:
    """The later window's weight at frame `position` (0-based) of a `blend`-frame crossfade: a linear ramp
    that never reaches 0 or 1 inside the blend."""
    return (position + 1) / (blend + 1)


def crossfade(earlier: np.ndarray, later: np.ndarray, position: int, blend: int) -> np.ndarray:
    """One frame of the crossfade, float32."""
    w = np.float32(seam_weight(position, blend))
    return (np.float32(1.0) - w) * earlier.astype(np.float32) + w * later.astype(np.float32)


def join_audio(layout: ChunkLayout, latents: list[np.ndarray]) -> np.ndarray:
    """(1, C, A, M): window 0's audio latents, then each later window's after its pinned carry, cut to the
    clip's length (rounding may leave it a latent or two short: the assembler pads the waveform)."""
    parts = [latents[0], *(lat[:, :, layout.carry_audio :] for lat in latents[1:])]
    joined = np.concatenate(parts, axis=2)
    return joined[:, :, : audio_latents(layout.total, layout.fps)]
