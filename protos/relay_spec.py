"""The Prompt Relay fields of the render spec: `--segment TEXT SECONDS` (repeatable), `--relay-epsilon` and
`--relay-strength`, as the MLX port names them.

Why seconds: a segment is a moment of the film ("the door opens" for 2 s), which the user knows in time, not
in latent frames (the port's LEN_FRAMES); the planner holds them to the clip and the engine turns them into
frames (`ltx_engine.rules.prompt_relay`). Segments run back to back from the clip's start in the order given,
so two can never overlap; what is left of the clip after the last reads the prompt alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from protos.fields import SpecError, number, short_repr, text

MAX_SEGMENTS = 32          # each is a Gaussian over the text columns of every forward
MAX_SEGMENT_CHARS = 2_000  # the combined prompt must fit the encoder's 1024 tokens anyway
MAX_SEGMENT_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class Segment:
    """One moment of the clip: a local prompt held to the next `seconds`."""

    text: str
    seconds: float

    def to_dict(self) -> dict:
        return {"text": self.text, "seconds": self.seconds}


def segment(name: str, value: Any) -> Segment:
    """{"text", "seconds"} (or the pair a flag gives): non-empty text, a positive, finite duration."""
    if isinstance(value, Segment):
        return value
    if isinstance(value, list | tuple) and len(value) == 2:
        value = {"text": value[0], "seconds": value[1]}
    if not isinstance(value, dict) or set(value) != {"text", "seconds"}:
        raise SpecError(f"{name} must be {{text, seconds}} (--segment TEXT SECONDS)")
    words = text(MAX_SEGMENT_CHARS)(f"{name} text", value["text"])
    if not words.strip():
        raise SpecError(f"{name} has no text: --segment TEXT SECONDS")
    seconds = number(0.0, MAX_SEGMENT_SECONDS, open_low=True)(f"{name} seconds", value["seconds"])
    return Segment(words, seconds)


def segments(name: str, value: Any) -> tuple[Segment, ...]:
    """The clip's moments, in order."""
    if not isinstance(value, list | tuple):
        raise SpecError(f"{name} must be a list of segments")
    if len(value) > MAX_SEGMENTS:
        raise SpecError(f"{len(value)} segments: at most {MAX_SEGMENTS} per render")
    return tuple(segment(f"segment {i + 1}", one) for i, one in enumerate(value))


def epsilon(name: str, value: Any) -> float:
    """The falloff, in (0, 1) open at both ends (the port refuses 1: no falloff at all, not a sharp one)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not 0 < value < 1:
        raise SpecError(f"--relay-epsilon {short_repr(value)} must be a number in (0, 1), e.g. 0.001")
    return float(value)


def segment_flags(values: list[tuple[str, float]] | None) -> list[dict] | None:
    """`--segment TEXT SECONDS` uses (farm_cli/multi_option.py takes two values per use) as the field's raw
    list."""
    return [{"text": t, "seconds": s} for t, s in values] if values else None
