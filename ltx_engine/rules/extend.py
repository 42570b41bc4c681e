"""Extend: continue a source clip after (or before) it. Pure layout arithmetic, no model.

The distilled extend of the MLX port (its docs; the stored `extend.py` at 1b7127d is the dev variant,
which pins the whole source instead): the source's boundary 25 pixel frames (1 + 3 * 8, so 4 latent
frames under the causal VAE, the first one a single frame) are re-encoded as a clip of their own at
each stage's size, and pinned (replace, strength 1: denoise mask 0) at latent index 0 of a window of
4 + N latent frames (`after`), or at latent index N (`before`, the source's head after the new frames);
their audio, round(25 / fps * 25) audio latents, is pinned at the same end of the window's audio.
Stage 1 and stage 2 both pin them (stage 2's audio is stage 1's, frozen). The window's new latents
are then joined to the source's own latents and the whole clip decodes once: after, source + window[4:];
before, window[:N] + source. Output length: source frames + 8 N.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONTEXT_PIXEL_FRAMES = 25
CONTEXT_LATENT_FRAMES = 4
AUDIO_LATENTS_PER_SECOND = 25.0
DIRECTIONS = ("after", "before")


class ExtendError(ValueError):
    """An extend the source cannot take (one line)."""


def audio_latents(frames: int, fps: float) -> int:
    """Audio latents of `frames` pixel frames (the planner's `audio_latent_frames` rule)."""
    return round(frames / fps * AUDIO_LATENTS_PER_SECOND)


@dataclass(frozen=True)
class ExtendLayout:
    """Where the pinned context and the new frames sit, for a source of `source_frames` pixel frames."""

    source_frames: int
    fps: float
    new_latent_frames: int
    direction: str = "after"

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ExtendError(f"--direction {self.direction!r}: one of {', '.join(DIRECTIONS)}")
        if self.new_latent_frames < 1:
            raise ExtendError(f"--extend-frames {self.new_latent_frames}: at least 1 latent frame")
        if self.source_frames < CONTEXT_PIXEL_FRAMES or (self.source_frames - 1) % 8:
            raise ExtendError(
                f"the source has {self.source_frames} frames; extend needs 8k + 1 frames, "
                f"at least {CONTEXT_PIXEL_FRAMES}"
            )

    @property
    def window_frames(self) -> int:
        """Pixel frames of the window each stage denoises (25 + 8 N)."""
        return CONTEXT_PIXEL_FRAMES + 8 * self.new_latent_frames

    @property
    def output_frames(self) -> int:
        return self.source_frames + 8 * self.new_latent_frames

    @property
    def context_pixels(self) -> tuple[int, int]:
        """[start, stop) pixel frames of the source re-encoded as the pinned context."""
        if self.direction == "after":
            return self.source_frames - CONTEXT_PIXEL_FRAMES, self.source_frames
        return 0, CONTEXT_PIXEL_FRAMES

    @property
    def context_latent_index(self) -> int:
        return 0 if self.direction == "after" else self.new_latent_frames

    @property
    def context_frame(self) -> int:
        """The pixel frame a replace condition names to land at `context_latent_index` (0, or 1 + 8 (k - 1))."""
        k = self.context_latent_index
        return 0 if k == 0 else 8 * (k - 1) + 1

    @property
    def context_audio(self) -> int:
        return audio_latents(CONTEXT_PIXEL_FRAMES, self.fps)

    @property
    def window_audio(self) -> int:
        return audio_latents(self.window_frames, self.fps)

    @property
    def audio_pin_start(self) -> int:
        """First audio token of the window the context's audio is pinned at."""
        return 0 if self.direction == "after" else self.window_audio - self.context_audio

    def source_audio_slice(self, source_audio_frames: int) -> slice:
        """The source audio latents pinned (its last or first `context_audio`)."""
        n = min(self.context_audio, source_audio_frames)
        return (
            slice(source_audio_frames - n, source_audio_frames) if self.direction == "after" else slice(0, n)
        )


def assemble_video(layout: ExtendLayout, source: np.ndarray, window: np.ndarray) -> np.ndarray:
    """(1, C, F_src + N, h, w): the source's latents joined to the window's new ones, decoded whole."""
    n = layout.new_latent_frames
    new = window[:, :, CONTEXT_LATENT_FRAMES:] if layout.direction == "after" else window[:, :, :n]
    parts = (source, new) if layout.direction == "after" else (new, source)
    return np.concatenate(parts, axis=2)


def assemble_audio(layout: ExtendLayout, source: np.ndarray, window: np.ndarray) -> np.ndarray:
    """(1, C, A, M): the source's audio latents joined to the window's new ones, A for the output length."""
    want = audio_latents(layout.output_frames, layout.fps)
    if layout.direction == "after":
        joined = np.concatenate([source, window[:, :, layout.context_audio :]], axis=2)
        return joined[:, :, :want]
    joined = np.concatenate([window[:, :, : layout.audio_pin_start], source], axis=2)
    return joined[:, :, joined.shape[2] - want :] if joined.shape[2] > want else joined
