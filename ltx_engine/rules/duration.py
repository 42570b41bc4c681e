"""A predicted duration → a clip length, the way upstream's DurationPredictor snaps it. Pure.

The DurationHead (a model, `ltx_engine.models.duration_head`) runs on a worker; the planner only needs
the rule that turns its seconds into an 8k + 1 frame count, and the shortest length the rule can give
(what a render whose length is not picked yet is checked against at submit).
"""

from __future__ import annotations

from ltx_engine.rules.dfr_layout import TEMPORAL_SCALE

MIN_SECONDS, MAX_SECONDS = 1.0, 20.0   # upstream AutoDuration defaults


def frames_for(seconds: float, frame_rate: float, min_seconds: float = MIN_SECONDS,
               max_seconds: float = MAX_SECONDS) -> int:
    """Upstream's seconds_to_clamped_num_frames: clamp round(s * fps) to the frame range, floor to
    8k + 1, and when that falls below the minimum take the next grid point up (capped at the maximum)."""
    low, high = round(min_seconds * frame_rate), round(max_seconds * frame_rate)
    raw = max(low, min(round(seconds * frame_rate), high))
    frames = ((raw - 1) // TEMPORAL_SCALE) * TEMPORAL_SCALE + 1
    if frames < low:
        frames = min(-(-(low - 1) // TEMPORAL_SCALE) * TEMPORAL_SCALE + 1, high)
    return frames


def shortest_frames(frame_rate: float, min_seconds: float = MIN_SECONDS, max_seconds: float = MAX_SECONDS) -> int:
    """The shortest length the head can pick at this rate (its prediction clamped to the minimum)."""
    return frames_for(0.0, frame_rate, min_seconds, max_seconds)


def range_problem(min_seconds: float, max_seconds: float, frame_rate: float) -> str | None:
    """Why `--auto-duration MIN:MAX` cannot bound the head's pick at this rate, or None: the range must lie
    inside the head's own (upstream's AutoDuration defaults) and hold at least one 8k + 1 length."""
    if min_seconds < MIN_SECONDS or max_seconds > MAX_SECONDS or min_seconds > max_seconds:
        return (f"--auto-duration {min_seconds:g}:{max_seconds:g} is outside the duration head's "
                f"{MIN_SECONDS:g}:{MAX_SECONDS:g} s")
    low, high = round(min_seconds * frame_rate), round(max_seconds * frame_rate)
    first = -(-(low - 1) // TEMPORAL_SCALE) * TEMPORAL_SCALE + 1  # the first 8k + 1 length at or above low
    if first > high:
        return (f"--auto-duration {min_seconds:g}:{max_seconds:g} holds no 8k+1 length at {frame_rate:g} fps "
                f"({low}..{high} frames): widen it")
    return None
