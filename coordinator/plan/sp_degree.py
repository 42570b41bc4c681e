"""The sequence-parallel degree of a stage-1 task, chosen from the workers idle at lease time (pure).

`requested` is the render's `--stage1-parallel`: None (auto) or K (at most K; 1 = off). Auto takes the
degree whose modelled step is shortest (`ltx_engine.sp_plan.step_seconds`: the audio / AdaLN part
replicated, the rest split, the gathers over the link), preferring fewer workers unless one more saves
at least `MIN_GAIN` of the step, so a deep queue keeps renders side by side and a lone render spreads.
"""

from __future__ import annotations

from coordinator.plan import costs
from ltx_engine.sp_plan import FULL_SIZE, DitDims, step_seconds

MIN_GAIN = 0.05  # an extra worker must save 5 % of the step
LINKS = {"10gbe": 1.1e9, "thunderbolt5": 8e9}


def stage1_degree(requested: int | None, idle: int, tokens: int, link_bytes_per_s: float,
                  chip: str | None = None, dims: DitDims = FULL_SIZE) -> int:
    """Degree in 1..min(requested, idle, tokens) for a stage 1 of `tokens` video tokens."""
    if requested is not None and requested < 1:
        raise ValueError(f"--stage1-parallel must be auto or at least 1, not {requested}")
    cap = max(1, min(idle, tokens, requested if requested is not None else idle))
    if requested is not None:
        return cap
    speed = costs.chip_speed(chip)
    replicated = costs.DIT_FORWARD_S / speed
    split = (costs.dit_forward_s(tokens) - costs.DIT_FORWARD_S) / speed
    best, best_s = 1, step_seconds(1, tokens, split, replicated, link_bytes_per_s, dims)
    for k in range(2, cap + 1):
        t = step_seconds(k, tokens, split, replicated, link_bytes_per_s, dims)
        if t < best_s * (1 - MIN_GAIN):
            best, best_s = k, t
    return best
