"""Prompt Relay: a prompt per moment, held by a time-Gaussian penalty in the text cross-attention. Pure.

The MLX port's `conditioning/prompt_relay.py` (after WhatDreamsCost / Kijai's ComfyUI node): the prompt is
encoded followed by each segment's text (`combined_prompt`); the columns of a segment's tokens get an
additive penalty on every query token away from the segment's frames, so its text speaks only there, while
the prompt's own tokens (and the connector's registers) stay free everywhere. In latent-frame units, for a
segment of `length` frames starting at frame `first`: midpoint `(2 first + length) // 2`, a free plateau of
half-width `max(length // 2 - 2, 0)`, then `strength * (|f - mid| - plateau)^2 / (2 sigma^2)` with
`sigma = 1 / ln(1 / epsilon)`.

Ours beyond the port: segments are spans of seconds (`--segment TEXT SECONDS`, back to back), a latent
frame belongs to the span that holds its centre pixel (`frame_boundary`); a query token's frame is read
from its position (so a tile, a shard or a window gets its own rows); the audio stream is gated too, its
tokens at the scaled, non-integer frame of their time (the port gates video only). Everything the stages
need beyond the stage itself travels as one small table (`RelayTable`), the text task's `relay` output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

RELAY = "relay"                 # the text task's output and the stages' context input
DEFAULT_EPSILON = 1e-3          # the port's --relay-epsilon
DEFAULT_STRENGTH = 1.0          # the port's --relay-strength
TEMPORAL = 8                    # pixel frames per latent frame (the VAE's temporal factor)
CENTRE = (TEMPORAL - 1) / 2     # a latent frame f >= 1 covers pixels 8f-7..8f: its centre is 8f - 3.5


class RelayError(ValueError):
    """Segments that cannot be relayed: one line that says why (every worker would say it: not retried)."""

    retryable = False


@dataclass(frozen=True, slots=True)
class Span:
    """One segment on the clip's clock: its text and [start, end) seconds."""

    text: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class RelayTable:
    """What a stage needs to gate its text cross-attention: the clip's frame rate, the falloff and the
    strength, and per segment its text columns [tok_start, tok_end) and its [start, end) seconds."""

    fps: float
    epsilon: float
    strength: float
    segments: tuple[tuple[int, int, float, float], ...]

    def to_array(self) -> np.ndarray:
        """(1 + N, 4) float64: a header row (fps, epsilon, strength, N), then one row per segment."""
        rows = [(self.fps, self.epsilon, self.strength, float(len(self.segments)))]
        rows += [(float(a), float(b), s, e) for a, b, s, e in self.segments]
        return np.array(rows, np.float64)

    @classmethod
    def from_array(cls, array: np.ndarray) -> RelayTable:
        a = np.asarray(array, np.float64)
        if a.ndim != 2 or a.shape[1] != 4 or a.shape[0] != int(a[0, 3]) + 1:
            raise RelayError(f"a relay table is (1 + N, 4) with N in its header, not {a.shape}")
        fps, epsilon, strength = (float(x) for x in a[0, :3])
        return cls(fps, epsilon, strength, tuple((int(r[0]), int(r[1]), float(r[2]), float(r[3])) for r in a[1:]))


def spans(segments: Sequence[tuple[str, float]]) -> list[Span]:
    """`--segment TEXT SECONDS` in order: back to back from the clip's start."""
    out, t = [], 0.0
    for text, seconds in segments:
        out.append(Span(text, t, t + float(seconds)))
        t += float(seconds)
    return out


def segments_in(segments: Sequence[Span], start: float, end: float) -> list[Span]:
    """The segments a window [start, end) of the clip sees, clipped to it and on its own clock (a chunked
    render gives each window these)."""
    return [Span(s.text, max(s.start, start) - start, min(s.end, end) - start)
            for s in segments if s.start < end and s.end > start]


def combined_prompt(prompt: str, texts: Sequence[str]) -> str:
    """What the text task encodes: the prompt, then each segment's text after a space (the port's)."""
    return prompt + "".join(" " + t for t in texts)


def token_ranges(count: Callable[[str], int], prompt: str, texts: Sequence[str]) -> list[tuple[int, int]]:
    """Each segment's [start, end) text columns in the combined prompt, by counting the tokens of its growing
    prefixes (the port's incremental tokenization; `count` is the encoder's own, BOS included, EOS not).
    The connector moves the real tokens to the front in order, so token i is column i."""
    built, before, out = prompt, count(prompt), []
    for text in texts:
        built += " " + text
        now = count(built)
        if now <= before:
            raise RelayError(f"--segment {text!r} gives no text tokens")
        out.append((before, now))
        before = now
    return out


def frame_boundary(seconds: float, fps: float) -> int:
    """The first latent frame whose centre pixel is at or after `seconds` (frame 0's centre is pixel 0)."""
    pixel = seconds * fps
    return 0 if pixel <= 0 else math.ceil((pixel + CENTRE) / TEMPORAL - 1e-9)


def frame_span(start: float, end: float, fps: float) -> tuple[int, int]:
    """The latent frames [first, stop) a segment of [start, end) seconds holds."""
    return frame_boundary(start, fps), frame_boundary(end, fps)


def check_spans(segments: Sequence[Span], frames: int, fps: float) -> None:
    """Refuse segments past the clip's end, or one that holds no latent frame (its penalty would leave it
    free on every frame: the port refuses a zero-length beat)."""
    clip = frames / fps
    for s in segments:
        if s.end > clip + 1e-6:
            raise RelayError(f"--segment {s.text!r} ends at {s.end:g} s, past the clip's end ({frames} frames at "
                             f"{fps:g} fps = {clip:g} s)")
        first, stop = frame_span(s.start, s.end, fps)
        if stop <= first:
            raise RelayError(f"--segment {s.text!r} ({s.end - s.start:g} s from {s.start:g} s) holds no latent frame "
                             f"(one is {TEMPORAL} frames, {TEMPORAL / fps:g} s at {fps:g} fps): make it longer")


def sigma(epsilon: float) -> float:
    """The Gaussian's width in latent frames: the port's constant 1 / ln(1 / epsilon)."""
    if not 0.0 < epsilon < 1.0:
        raise RelayError(f"--relay-epsilon {epsilon:g} is outside (0, 1)")
    return 1.0 / math.log(1.0 / epsilon)


def video_frames(positions: np.ndarray, fps: float) -> np.ndarray:
    """(T,) each video token's latent frame from its positions (B, 3, T, 2), time [start, end) in seconds:
    a generated frame f ends at pixel 8f + 1. Tokens of one pixel frame past frame 0 (guides, slots: the
    tokens the port appends) are NaN: free."""
    start = positions[0, 0, :, 0].astype(np.float64) * fps
    end = positions[0, 0, :, 1].astype(np.float64) * fps
    frames = np.round((end - 1.0) / TEMPORAL)
    return np.where((end - start < TEMPORAL / 2) & (start > 0.5), np.nan, frames)


def audio_frames(positions: np.ndarray, fps: float) -> np.ndarray:
    """(T,) each audio token's latent-frame coordinate, not whole: its mid time on the video's frame clock
    (a frame's centre pixel 8f - 3.5 maps to f)."""
    mid = (positions[0, 0, :, 0].astype(np.float64) + positions[0, 0, :, 1]) / 2 * fps
    return (mid + CENTRE) / TEMPORAL


def relay_bias(frames: np.ndarray, table: RelayTable, columns: int) -> np.ndarray:
    """(T, columns) float32 additive bias: 0 where a token may read a column, minus the segment's penalty on
    its text columns elsewhere. `frames`: each query token's latent frame (NaN: free). float32 in the port's
    order of operations, so a generated frame's row is the port's to the bit."""
    width = sigma(table.epsilon)
    inverse = np.float32(1.0 / (2.0 * width * width))
    bias = np.zeros((len(frames), columns), np.float32)
    real = ~np.isnan(frames)
    f = np.where(real, frames, 0.0).astype(np.float32)
    for tok_start, tok_end, start, end in table.segments:
        if tok_end > columns:
            raise RelayError(f"segment columns [{tok_start}, {tok_end}) past the text's {columns}")
        first, stop = frame_span(start, end, table.fps)
        if stop <= first:
            raise RelayError(f"a segment of [{start:g}, {end:g}) s holds no latent frame")
        mid, plateau = np.float32((first + stop) // 2), np.float32(max((stop - first) // 2 - 2, 0))
        over = np.maximum(np.abs(f - mid) - plateau, np.float32(0.0))
        penalty = np.float32(table.strength) * np.square(over) * inverse
        bias[:, tok_start:tok_end] = np.where(real, -penalty, np.float32(0.0))[:, None]
    return bias
