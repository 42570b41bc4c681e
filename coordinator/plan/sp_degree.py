"""The sequence-parallel degree of a stage-1 task, chosen from the workers idle at lease time (pure).

`requested` is the render's `--stage1-parallel`: None (auto) or K (at most K; 1 = off). Auto takes the
degree whose modelled step is shortest (`ltx_engine.rules.sp_plan.step_seconds`: the audio / AdaLN part
replicated, the rest split, the gathers over the link), preferring fewer workers unless one more saves
at least `MIN_GAIN` of the step, so a deep queue keeps renders side by side and a lone render spreads.
"""

from __future__ import annotations

from coordinator.plan import costs
from coordinator.plan.graph import SpecError
from coordinator.plan.sparse import step_cache
from ltx_engine.rules.sp_plan import FULL_SIZE, DitDims, step_seconds

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


# The gang lease (lease.lua's gang follows these rules, the simulation in
# coordinator/plan/lease_sim.py runs them): the first idle worker that asks for a stage-1 task opens a
# reservation of degree k = the table's entry for the workers idle then (itself included); other
# workers that ask join it until k are in or GANG_WINDOW_S has passed since it opened; then the gang
# starts with the members it has (at least the opener).
GANG_WINDOW_S = 2.0
REQUEST_PARAM = "stage1_parallel_request"  # a stage-1 task's --stage1-parallel: "auto" / absent, or K
DEGREE_PARAM = "stage1_parallel"  # the degree used, written at lease time (the worker reads it)
TABLE_PARAM = "stage1_degrees"  # [degree when 1 idle, when 2 idle, ...], computed at submit


def requested(params: dict, default: int | None = None) -> int | None:
    """A stage-1 task's request: None (auto) or K (at most K; 1 = off); `default` when it names none."""
    value = params.get(REQUEST_PARAM, "unset")
    if value == "unset":
        return default
    return None if value in (None, "auto") else int(value)


def degree_table(requested_k: int | None, workers: int, tokens: int, link_bytes_per_s: float,
                 chip: str | None = None) -> list[int]:
    """stage1_degree for 1..workers idle workers: what the Lua looks up by its idle count at lease time."""
    return [stage1_degree(requested_k, idle, tokens, link_bytes_per_s, chip) for idle in range(1, workers + 1)]


def degree_for_idle(table: list[int], idle: int) -> int:
    """The table's degree for `idle` idle workers (past its end: its last entry)."""
    return max(1, table[min(max(idle, 1), len(table)) - 1]) if table else 1


def gang_starts(members: int, k: int, opened_s: float, now_s: float, window_s: float = GANG_WINDOW_S) -> bool:
    """Whether a reservation of degree k with `members` in starts now: full, or its window is over."""
    return members >= 1 and (members >= k or now_s >= opened_s + window_s)


def gang_seconds(cost_s: float, steps: int, tokens: int, k: int, ratio: float, link_bytes_per_s: float,
                 dims: DitDims = FULL_SIZE) -> float:
    """Seconds of a stage 1 of `cost_s` reference seconds (`steps` forwards over `tokens` video tokens)
    on k ranks whose slowest takes `ratio` seconds per reference second: per step the replicated part
    (`dims`' share of the reference's), the split part over k, and the gathers' wire not hidden behind
    compute (step_seconds)."""
    steps = max(1, steps)
    forward = cost_s / steps * ratio
    replicated = min(forward, costs.DIT_FORWARD_S * ratio * min(1.0, dims.replicated_scale))
    if k <= 1:
        return forward * steps
    return steps * step_seconds(k, tokens, forward - replicated, replicated, link_bytes_per_s, dims)


# ---------------------------------------------------------------- the gang lease in the farm
GANG_MAX = 8  # protos/sp_spec.py MAX_DEGREE; coordinator/state/lua/gang.lua GANG_MAX; the table's length
AUTO_MIN_STAGE1_S = 60.0  # auto gangs only a stage 1 modelled this long on the reference Mac: a gang's
# group open and rank start (a few seconds) must stay small beside what it saves


def stage1_params(spec, tokens: int, steps: int) -> dict:
    """The stage-1 task's request and degree table (REQUEST_PARAM, TABLE_PARAM), fixed at submit from
    the spec's `stage1_parallel`; auto on a stage 1 shorter than AUTO_MIN_STAGE1_S never gangs."""
    from protos.sp_spec import requested_degree

    value = spec.stage1_parallel
    request = requested_degree(value)
    if _cached(spec, request):
        return {REQUEST_PARAM: value, TABLE_PARAM: [1]}
    if request is None and steps * costs.dit_forward_s(tokens) < AUTO_MIN_STAGE1_S:
        table = [1]
    else:
        table = degree_table(request, GANG_MAX, tokens, LINKS["10gbe"])
    return {REQUEST_PARAM: value, TABLE_PARAM: table}


def _cached(spec, request: int | None) -> bool:
    """Whether the render caches its steps (the cache's state lives in one process: nothing gangs);
    refused beside an explicit K."""
    if step_cache(spec) is None:
        return False
    if request not in (None, 1):
        raise SpecError(f"--stage1-parallel {spec.stage1_parallel} with --step-cache: a cached stage 1 runs on one "
                        "worker (drop one of them)")
    return True


def pass_request(spec) -> str | None:
    """A guided stage 1's --stage1-parallel K when it asks for a gang (K ≥ 2), else None: a guidance pass
    is one forward, which auto never gangs (AUTO_MIN_STAGE1_S), so its tasks carry no table then."""
    from protos.sp_spec import requested_degree

    request = requested_degree(spec.stage1_parallel)
    return None if request in (None, 1) or _cached(spec, request) else str(spec.stage1_parallel)


def pass_params(value: str | None, tokens: int) -> dict:
    """A guidance pass's request and degree table (`pass_request`'s K), gang-leased as a stage 1 is."""
    if value is None:
        return {}
    return {REQUEST_PARAM: value, TABLE_PARAM: degree_table(int(value), GANG_MAX, tokens, LINKS["10gbe"])}


def local_degree(params: dict) -> int:
    """The split `farm render --local` runs a stage 1 with: the table's degree with every Mac idle."""
    return degree_for_idle(list(params.get(TABLE_PARAM) or [1]), GANG_MAX)


def gang_degree(table: list[int], idle_at_open: int, joined: int, opened_s: float, now_s: float,
                window_s: float = GANG_WINDOW_S) -> int | None:
    """THE gang lease rule, as coordinator/state/lua/gang.lua runs it (the simulation, lease_sim.py,
    follows the same two pieces, `degree_for_idle` and `gang_starts`): the degree a stage-1 task runs
    at, or None while its reservation still waits for members.

    - The worker that takes the task from its queue (queue order, fair share, affinity, as any task)
      opens a reservation wanting k = degree_for_idle(table, idle_at_open): idle_at_open counts
      itself plus the live idle workers in no other reservation that hold the task's pack. k < 2: a
      plain lease (degree 1). The task leaves its queue while the reservation is open.
    - Until it starts, every idle worker that asks for work and can run the task (its queue, pack,
      memory, not blocklisted) JOINS it instead of taking other work; `joined` counts the members,
      the opener included. Busy workers are never waited for.
    - It starts when joined ≥ k or `window_s` has passed since it opened (gang_starts), with the
      members it has: degree = min(joined, k); 1 = the opener runs it as a plain task. A reservation
      no member asked about for 3 windows goes back to its queue: nothing holds workers for long, so
      no deadlock with other renders' tasks.
    """
    k = degree_for_idle(table, idle_at_open)
    if k < 2:
        return 1
    if not gang_starts(joined, k, opened_s, now_s, window_s):
        return None
    return max(1, min(joined, k))
