"""A predicted duration → a clip length, the way upstream's DurationPredictor snaps it. Pure.

The DurationHead (a model, `ltx_engine.models.duration_head`) runs on a worker; the planner only needs
the rule that turns its seconds into an 8k + 1 frame count, and the shortest length the rule can give
(what a render whose length is not picked yet is checked against at submit).
"""

from __future__ import annotations

from ltx_engine.dfr_layout import TEMPORAL_SCALE

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


def shortest_frames(frame_rate: float) -> int:
    """The shortest length the head can pick at this rate (its prediction clamped to the minimum)."""
    return frames_for(0.0, frame_rate)
