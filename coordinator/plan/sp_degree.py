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


# ---------------------------------------------------------------- the gang lease (issue #25)
GANG_MAX = 8  # protos/sp_spec.py MAX_DEGREE; coordinator/state/lua/gang.lua GANG_MAX
GANG_WINDOW_S = 1.5  # policy gang_window_ms: how long a reservation waits for its members
AUTO_IDLE = GANG_MAX  # auto's cap at submit: the degree the cost model would take with every Mac idle
AUTO_MIN_STAGE1_S = 60.0  # auto gangs only a stage 1 modelled this long on the reference Mac: a gang's
# group open and rank start (a few seconds) must stay small beside what it saves


def gang_cap(requested: int | None, tokens: int, steps: int, link_bytes_per_s: float = LINKS["10gbe"],
             chip: str | None = None, dims: DitDims = FULL_SIZE) -> int:
    """The most workers a stage-1 task may gang (its `params.gang_cap`, fixed at submit): K, or for
    auto the cost model's degree with AUTO_IDLE Macs idle (`stage1_degree`), for a stage 1 of at least
    AUTO_MIN_STAGE1_S. 1: never a gang."""
    if requested is not None:
        return max(1, min(requested, GANG_MAX, tokens))
    if steps * costs.dit_forward_s(tokens) < AUTO_MIN_STAGE1_S:
        return 1
    return stage1_degree(None, AUTO_IDLE, tokens, link_bytes_per_s, chip, dims)


def gang_degree(cap: int, idle_at_open: int, joined: int, window_passed: bool) -> int | None:
    """THE gang lease rule (coordinator/state/lua/gang.lua does exactly this; the fleet simulation
    follows it): the degree a stage-1 task runs at, or None while its reservation still waits.

    - A worker that takes the task from its queue (queue order, backfilling and affinity as any task)
      opens a reservation wanting `want = min(cap, 1 + idle_at_open)`: itself plus the live idle
      workers that are in no other reservation at that moment. want < 2: a plain lease, degree 1.
    - Until the reservation starts, every idle worker that asks for work and can run the task (pack,
      memory, not blocklisted) JOINS it instead of taking other work; `joined` counts the members,
      opener included.
    - It starts as soon as joined == want, or when the window (GANG_WINDOW_S) has passed, with the
      members it has: degree = joined (1: the opener runs it as a plain task). So a deep queue keeps
      renders side by side (workers busy at open are not waited for) and a lone render spreads over
      every idle Mac; a reservation holds at most `want` workers for at most one window, and a
      reservation whose members stopped asking for 3 windows goes back to its queue (no deadlock).
    """
    want = min(cap, 1 + idle_at_open)
    if want < 2:
        return 1
    if joined >= want or window_passed:
        return max(1, min(joined, want))
    return None


def stage1_params(spec, tokens: int, steps: int) -> dict:
    """The stage-1 task's gang cap from the spec's `stage1_parallel` ({} when it can never gang)."""
    from protos.sp_spec import requested_degree

    cap = gang_cap(requested_degree(spec.get("stage1_parallel")), tokens, steps)
    return {"gang_cap": cap} if cap > 1 else {}
