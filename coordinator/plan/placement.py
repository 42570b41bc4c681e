"""Where a render's tasks would run and when they would end, from the cost model. Pure.

Why: `farm plan`, the ETA in `farm ls` / `farm status` / the dashboard and the submit refusal of a
render no worker can hold all read one simulation of the farm's scheduling: coordinator/plan/lease_sim.py
runs lease.lua's rules (queue order, memory, dealing, fair share, affinity, backfilling, the stage-1
gang) over the workers here (`Slot`: memory, chip, measured ratios), each task taking the cost
model's seconds on the worker that takes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

from coordinator.plan import costs
from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import CAPABILITY, SpecError
from coordinator.plan.lease_sim import DEAL_MARGIN, Placed, Simulation, SpRule, deal_takes, peer_tiles_before
from coordinator.plan.resolved import RenderPlan
from coordinator.plan.sp_degree import LINKS

__all__ = ["DEAL_MARGIN", "Placed", "SpRule", "Slot", "deal_takes", "peer_tiles_before", "simulate"]

COORDINATOR_SLOT = "coordinator"


@dataclass
class Slot:
    """One worker as the simulation sees it: its memory, chip and measured ratios per kind."""

    name: str
    chip: str = ""
    memory_bytes: int = 0
    ratios: dict[str, float] = field(default_factory=dict)
    free_at: float = 0.0
    count: int = 1  # a fleet file's "count": that many Macs of this class
    warm: list[str] = field(default_factory=list)  # components loaded (the worker's last report)
    loads: dict[str, float] = field(default_factory=dict)  # measured cold-start seconds per kind

    def seconds(self, task: Mapping) -> float:
        """The cost model's seconds for `task` (a planned task or a task view) on this worker: its
        compute, plus loading its models when they are not warm here."""
        kind = str(task.get("kind", ""))
        run = self.compute_seconds(task)
        if not set(_needs(task)) <= set(self.warm):
            run += self.loads.get(kind, float(_params(task).get("load_s") or task.get("load_s") or 0.0))
        return run

    def compute_seconds(self, task: Mapping) -> float:
        """The task's compute here (no model load): its cost × this worker's ratio, ×1.05 streamed."""
        cost = float(_params(task).get("cost_s") or task.get("cost_s") or 0.0)
        run = costs.worker_seconds(cost, str(task.get("kind", "")), self.ratios, self.chip)
        if costs.streams_on(self.memory_bytes, _params(task) or task):
            run *= costs.STREAM_TIME_FACTOR
        return run

    def run(self, task: Mapping, start: float) -> float:
        """Take `task` from `start`: its end; its models are warm here afterwards."""
        self.free_at = start + self.seconds(task)
        self.warm = sorted(set(self.warm) | set(_needs(task)))
        return self.free_at

    def holds(self, task: Mapping) -> bool:
        need = int(_params(task).get("min_memory_bytes") or task.get("min_memory_bytes") or 0)
        if need and self.memory_bytes and costs.streams_on(self.memory_bytes, _params(task) or task):
            return True  # runs streamed (ltx_engine.loading.streaming)
        return not need or not self.memory_bytes or need <= self.memory_bytes

    def streams(self, task: Mapping) -> bool:
        """Whether this worker would run `task` with its DiT blocks streamed."""
        return costs.streams_on(self.memory_bytes, _params(task) or task)


def _needs(task: Mapping) -> list[str]:
    return list(_params(task).get("needs") or task.get("needs") or [])


def _params(task: Mapping) -> Mapping:
    params = task.get("params")
    return params if isinstance(params, Mapping) else {}


def refuse_oversize(spec: RenderPlan, tasks: list[dict], holders: Fleet) -> None:
    """Refuse, with the numbers, a render with a task no worker holding its pack can hold."""
    largest = holders.largest_memory()
    if not largest:
        return
    def need(t: Mapping) -> int:  # a DiT task fits where its streamed peak does
        return int(t["params"].get("min_memory_stream_bytes") or t["params"].get("min_memory_bytes") or 0)

    worst = max((t for t in tasks if t.get("capability") == CAPABILITY), key=need, default=None)
    if worst is None or need(worst) <= largest:
        return
    peak = int(worst["params"].get("stream_peak_bytes") or worst["params"]["peak_bytes"])
    raise SpecError(
        f"{spec.width}x{spec.height}x{spec.frames}: task {worst['id'].split('.', 1)[-1]} "
        f"({worst['kind']}) needs ~{peak / 2**30:.1f} GiB at its peak; the largest worker holding "
        f"{spec.pack!r} can use {largest * costs.USABLE_FRACTION / 2**30:.1f} of its {largest / 2**30:.1f} GiB")


def simulate(tasks: list[Mapping], slots: list[Slot], done: Mapping[str, float] | None = None,
             running: Mapping[str, tuple[str, float]] | None = None, coordinator: Slot | None = None,
             sp: SpRule | None = None) -> list[Placed]:
    """Place `tasks` (plan order, with deps) on `slots` by lease.lua's rules (lease_sim). `done`:
    finished task ids (end 0); `running`: task id → (slot name, seconds left), occupying that slot
    first; `sp`: sequence-parallel stage 1 (None: on one worker). Tasks no slot holds are left out."""
    sim = Simulation(list(tasks), slots, coordinator or Slot(COORDINATOR_SLOT), sp)
    return sim.run(dict(done or {}), dict(running or {}))


def expand(slots: Iterable[Slot]) -> list[Slot]:
    """A fleet file's classes as one slot per Mac (`count` of each)."""
    return [Slot(f"{s.name}#{i + 1}" if s.count > 1 else s.name, s.chip, s.memory_bytes, dict(s.ratios),
                 loads=dict(s.loads)) for s in slots for i in range(max(1, s.count))]


def _left(view: Mapping, slot: Slot, now_ms: int) -> float:
    """Seconds a running task has left: from its step progress when it reports one, else predicted."""
    ran = max(0.0, (now_ms - int(view.get("leased_ms") or now_ms)) / 1000.0)
    progress = view.get("progress") if isinstance(view.get("progress"), Mapping) else {}
    step, total = progress.get("step"), progress.get("total")
    if isinstance(step, int) and isinstance(total, int) and 0 < step <= total:
        return ran * (total - step) / step
    predicted = slot.seconds(view)
    return max(predicted - ran, 0.1 * predicted)  # past its prediction: not done yet


def eta_seconds(views: list[Mapping], slots: list[Slot], now_ms: int, coordinator: Slot | None = None,
                ) -> float | None:
    """Seconds until a render's tasks are done on these workers (task views carrying `cost_s` and
    `deps`), running tasks first; None when the plan has no costs (planned before the cost model)."""
    return farm_eta_seconds([views], slots, now_ms, coordinator)[0]


# The live ETA: a stage-1 task runs sequence parallel only where it carries its request (the gang lease).
ETA_SP = SpRule(LINKS["10gbe"], default=1)


def farm_eta_seconds(renders: list[list[Mapping]], slots: list[Slot], now_ms: int,
                     coordinator: Slot | None = None, meta: list[tuple[int, str]] | None = None,
                     sp: SpRule | None = ETA_SP) -> list[float | None]:
    """Each render's seconds until its tasks are done when the fleet takes every render's tasks in
    this order (the scheduler's: priority, then age), running tasks first: one simulation for the whole
    farm, so a queued render waits behind those before it. `meta`: each render's (priority, submitter),
    for the queue's priority bands and fair share. None for a render without costs. Works on copies:
    the caller's slots are left as they were."""
    if meta is not None:
        renders = [[{**v, "priority": p, "submitter": s} for v in views]
                   for views, (p, s) in zip(renders, meta, strict=True)]
    slots = [Slot(**asdict(s)) for s in slots]
    coordinator = Slot(**asdict(coordinator)) if coordinator is not None else None
    by_name = {s.name: s for s in slots}
    costed = [bool(slots) and any(v.get("cost_s") for v in views) for views in renders]
    views_all = [v for views, ok in zip(renders, costed, strict=True) if ok for v in views]
    done = {str(v["id"]): 0.0 for v in views_all if v.get("display") in ("done", "cancelled")}
    running = {str(v["id"]): (str(v["worker"]), _left(v, by_name[str(v["worker"])], now_ms)) for v in views_all
               if v.get("display") in ("leased", "running") and str(v.get("worker")) in by_name}
    for v in views_all:
        if str(v["id"]) in running:  # its models are warm there once it ends
            slot = by_name[str(v["worker"])]
            slot.warm = sorted(set(slot.warm) | set(_needs(v)))
    rest = [v for v in views_all if str(v["id"]) not in done and str(v["id"]) not in running]
    ends = {p.task: p.end for p in simulate(rest, slots, done, running, coordinator, sp)}
    ends.update({tid: left for tid, (_w, left) in running.items()})
    return [max((ends.get(str(v["id"]), 0.0) for v in views), default=0.0) if ok else None
            for views, ok in zip(renders, costed, strict=True)]
