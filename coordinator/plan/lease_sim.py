"""The fleet simulation: lease.lua's rules run over the cost model's seconds, one event at a time. Pure.

Why one simulator: `farm plan --fleet`, `farm bench model` and every ETA (coordinator/views/eta.py) ask the
same question — when does each task end if the workers pull them as the farm deals them — and once
answered a FIFO without backfilling (a task could not start before an earlier one had been placed).
The rules, as coordinator/state/lua/{common,lease}.lua apply them:
- queue: a task is queued when its deps are done, behind every task queued before it, a higher render
  priority first, then the planner's `lead` tasks (a chunked render's chain of windows; common.lua
  `ready_score`; a render's stages so become ready in stage order);
- a worker asks when it is free (a completion makes it idle, then it asks; workers ending at the same
  instant complete one after the other) and takes the first queued task it may: its memory holds the
  task's peak, resident or streamed (×1.05); a stage-2 tile only if speed-aware dealing leaves it one
  (`deal_takes`); a task it cannot take is passed over, so later tasks fill the gap (backfilling);
- fair share: among the first eligible task of each submitter in the top priority band, the one whose
  submitter holds the fewest leases; warm-model affinity: a worker with models loaded whose pick would
  load others takes a warm one of the next AFFINITY_LOOKAHEAD (same priority and submitter) unless the
  pick has waited AFFINITY_WAIT_S;
- stage 1 sequence parallel (the gang lease, coordinator/plan/sp_degree.py): the asker's degree k is
  the table's for the workers idle then (itself included); it opens a reservation that the workers
  asking next join until k are in or the window ends; the gang runs `gang_seconds` on its members;
- coordinator tasks (blend, cut, guide step) run on the coordinator, one at a time, in queue order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.plan import costs, sp_degree
from coordinator.plan.graph import CAPABILITY
from ltx_engine.rules.sp_plan import FULL_SIZE, DitDims

AFFINITY_LOOKAHEAD, AFFINITY_WAIT_S = 8, 5.0  # lease.lua's
FAIR_LOOKAHEAD = 64
DEAL_MARGIN = 0.9  # a peer must finish a tile this much sooner than the asker for it to wait (lease.lua)


@dataclass
class Placed:
    """A task's simulated run: on which slot, from when to when (seconds from the simulation's start);
    a gang's stage 1 names its other members and the degree it ran at."""

    task: str
    kind: str
    slot: str
    start: float
    end: float
    streamed: bool = False  # its DiT blocks streamed on that slot (resident peak too large there)
    degree: int = 1
    gang: tuple[str, ...] = ()


@dataclass
class SpRule:
    """Sequence-parallel stage 1 in the simulation: the link between the Macs and the gang's window;
    `default`: the request of a stage-1 task that names none (None: auto; 1: on one worker); `dims`:
    the DiT whose gathers cross the link (a real pack's unless a bench models another)."""

    link_bytes_per_s: float
    window_s: float = sp_degree.GANG_WINDOW_S
    default: int | None = None
    dims: DitDims = FULL_SIZE


def peer_tiles_before(own_s: float, free_in_s: float, seconds: float, margin: float = DEAL_MARGIN) -> int:
    """Tiles a peer free in `free_in_s`, taking `seconds` each, ends before margin x `own_s` (when the
    asking worker would end one it took now)."""
    limit = own_s * margin
    if seconds <= 0 or free_in_s + seconds >= limit:
        return 0
    return math.ceil((limit - free_in_s) / seconds) - 1


def deal_takes(
    queued: int, own_s: float, peers: Iterable[tuple[float, float]], margin: float = DEAL_MARGIN
) -> bool:
    """Speed-aware dealing, the rule lease.lua applies: a worker asking for one of a step's `queued`
    tiles takes one now unless its faster peers ((seconds until free, seconds per tile) each) would end
    all of them before it ended one; dealing each tile to whoever ends it soonest, it gets none."""
    before = sum(peer_tiles_before(own_s, free, seconds, margin) for free, seconds in peers)
    return before == 0 or before < queued


def params_of(task: Mapping) -> Mapping:
    params = task.get("params")
    return params if isinstance(params, Mapping) else task


def pace(slot: Any) -> float:
    """Seconds per reference second on this worker (its measured ratios' median, else 1 / chip speed)."""
    return costs.worker_seconds(1.0, "", slot.ratios, slot.chip)


@dataclass
class _Job:
    task: Mapping
    seq: int = 0
    ready_s: float = 0.0

    @property
    def tid(self) -> str:
        return str(self.task["id"])

    @property
    def key(self) -> tuple:
        return -int(self.task.get("priority") or 0), not self.task.get("lead"), self.seq

    @property
    def submitter(self) -> str:
        return str(self.task.get("submitter") or "")

    @property
    def tile(self) -> Any:
        return params_of(self.task).get("tile_index")


@dataclass
class _Gang:
    job: _Job
    k: int
    opened_s: float
    members: list = field(default_factory=list)


class Simulation:
    """One run of the rules above over `tasks` (plan order, with deps) on `slots` (placement.Slot)."""

    def __init__(self, tasks: list[Mapping], slots: list, coordinator: Any, sp: SpRule | None) -> None:
        self.slots, self.coordinator, self.sp = slots, coordinator, sp
        self.now, self.seq, self.events = 0.0, 0, []  # events: (time, seq, slot or gang, job)
        self.queue: list[_Job] = []
        self.coord_queue: list[_Job] = []
        self.idle: list = []
        self.gang: _Gang | None = None
        self.jobs = {str(t["id"]): _Job(t) for t in tasks}
        self.waiting: dict[str, set[str]] = {}
        self.ends: dict[str, float] = {}
        self.placed: list[Placed] = []
        self.held: dict[str, int] = {}  # leases per submitter (fair share)
        self.leases: dict[str, int] = {}  # a gang's task: the leases its members hold

    def run(self, done: Mapping[str, float], running: Mapping[str, tuple[str, float]]) -> list[Placed]:
        by_name = {s.name: s for s in self.slots}
        busy = set()
        self.ends.update(done)
        for tid, (slot_name, left) in running.items():
            slot = by_name.get(slot_name)
            self.ends[tid] = left
            if slot is not None:
                slot.free_at = max(slot.free_at, left)
                busy.add(slot.name)
            self._push(left, slot, None, tid)
        for tid, job in self.jobs.items():
            if tid in self.ends:
                continue
            deps = {str(d) for d in job.task.get("deps") or () if str(d) in self.jobs or str(d) in running}
            self.waiting[tid] = {d for d in deps if d not in done}
            if not self.waiting[tid]:
                self._enqueue(job)
        free = [s for s in self.slots if s.name not in busy]
        self.idle = [s for s in free if s.free_at <= 0]  # registered and idle: each asks in turn
        for slot in free:
            if slot.free_at > 0:
                self._push(slot.free_at, slot, None, None)  # free later: its first ask then
        self._dispatch(None)
        while self.events:
            self.now, _, who, tid = heapq.heappop(self.events)
            self._event(who, tid)
        return self.placed

    def _push(self, at: float, who: Any, job: _Job | None, tid: str | None = None) -> None:
        self.seq += 1
        heapq.heappush(
            self.events, (at, self.seq, who, tid if tid is not None else (job.tid if job else None))
        )

    def _enqueue(self, job: _Job) -> None:
        self.seq += 1
        job.seq, job.ready_s = self.seq, self.now
        target = self.queue if job.task.get("capability") in (None, CAPABILITY) else self.coord_queue
        target.append(job)
        target.sort(key=lambda j: j.key)

    def _event(self, who: Any, tid: str | None) -> None:
        if isinstance(who, _Gang):  # its window is over
            if self.gang is who:
                self._start_gang()
            self._dispatch(None)
            return
        if tid is not None:
            self._complete(tid)
        if who is self.coordinator or who is None:  # None: a running task on a worker not in the fleet
            self._start_coordinator()
            self._dispatch(None)
        else:
            self._dispatch(who)

    def _complete(self, tid: str) -> None:
        """A task ended: its lease is given back and the tasks waiting only on it are queued."""
        job = self.jobs.get(tid)
        if job is not None and job.task.get("capability") in (
            None,
            CAPABILITY,
        ):  # a gang: each member's lease
            self.held[job.submitter] = max(0, self.held.get(job.submitter, 0) - self.leases.pop(tid, 1))
        for other, deps in self.waiting.items():
            if tid in deps:
                deps.discard(tid)
                if not deps and other not in self.ends:
                    self._enqueue(self.jobs[other])

    def _start_coordinator(self) -> None:
        if not self.coord_queue or self.coordinator.free_at > self.now:
            return
        job = self.coord_queue.pop(0)
        end = self.coordinator.run(job.task, self.now)
        self._record(job, self.coordinator, [self.coordinator], end)

    def _record(self, job: _Job, slot: Any, members: list, end: float) -> None:
        self.ends[job.tid] = end
        self.placed.append(
            Placed(
                job.tid,
                str(job.task.get("kind", "")),
                slot.name,
                self.now,
                end,
                slot.streams(job.task),
                len(members),
                tuple(m.name for m in members[1:]),
            )
        )
        self._push(end, self.coordinator if slot is self.coordinator else slot, job)

    def _dispatch(self, asker: Any) -> None:
        """The worker that just became free asks first, then every idle one (fastest first)."""
        if asker is not None and asker not in self.idle:
            self.idle.append(asker)
        order = ([asker] if asker is not None else []) + sorted(
            (s for s in self.idle if s is not asker), key=lambda s: (pace(s), self.slots.index(s))
        )
        for slot in order:
            if slot in self.idle and self._lease(slot):
                self.idle.remove(slot)
        self._start_coordinator()

    def _lease(self, slot: Any) -> bool:
        """lease.lua for one ask: join the open gang, else the next task (maybe opening a gang)."""
        if self.gang is not None and slot.holds(self.gang.job.task):
            self.gang.members.append(slot)
            if sp_degree.gang_starts(
                len(self.gang.members),
                self.gang.k,
                self.gang.opened_s,
                self.now,
                self.sp.window_s if self.sp else 0.0,
            ):
                self._start_gang()
            return True
        job = self._next_job(slot)
        if job is None:
            return False
        self.queue.remove(job)
        self.held[job.submitter] = self.held.get(job.submitter, 0) + 1
        k = self._degree(job, slot)
        if k > 1:
            self.gang = _Gang(job, k, self.now, [slot])
            self._push(self.now + self.sp.window_s, self.gang, None)
            return True
        self._record(job, slot, [slot], slot.run(job.task, self.now))
        return True

    def _degree(self, job: _Job, slot: Any) -> int:
        """The sequence-parallel degree of a stage-1 task leased now: its table's for the idle workers."""
        params = params_of(job.task)
        if self.sp is None or (job.task.get("kind") != "denoise_stage1" and sp_degree.TABLE_PARAM not in params):
            return 1
        request = sp_degree.requested(dict(params), self.sp.default)
        if request == 1:
            return 1
        if costs.cells(params) < 2:  # a view without its grid: nothing to split
            return 1
        idle = 1 + sum(1 for s in self.idle if s is not slot and s.holds(job.task))
        table = params.get(sp_degree.TABLE_PARAM) or sp_degree.degree_table(
            request, len(self.slots), costs.cells(params), self.sp.link_bytes_per_s, slot.chip
        )
        return sp_degree.degree_for_idle(list(table), idle)

    def _start_gang(self) -> None:
        """The reservation runs with its members: the slowest sets the pace, each loads what is cold."""
        gang, self.gang = self.gang, None
        task, params = gang.job.task, params_of(gang.job.task)
        cost = float(params.get("cost_s") or 0.0)
        ratio = max(m.compute_seconds(task) / cost if cost else pace(m) for m in gang.members)
        steps = max(1, len(params.get("sigmas") or ()) - 1)
        loads = max(m.seconds(task) - m.compute_seconds(task) for m in gang.members)
        run = loads + sp_degree.gang_seconds(
            cost, steps, costs.cells(params), len(gang.members), ratio, self.sp.link_bytes_per_s, self.sp.dims
        )
        for m in gang.members:
            m.run(task, self.now)
            m.free_at = self.now + run
        self.held[gang.job.submitter] = self.held.get(gang.job.submitter, 0) + len(gang.members) - 1
        self.leases[gang.job.tid] = len(gang.members)
        self._record(gang.job, gang.members[0], gang.members, self.now + run)
        for m in gang.members[1:]:
            self._push(self.now + run, m, None)

    def _eligible(self, slot: Any, job: _Job) -> bool:
        return slot.holds(job.task) and not self._deal_declines(slot, job)

    def _next_job(self, slot: Any) -> _Job | None:
        """lease.lua next_task: queue order, fair share between submitters, then warm-model affinity."""
        firsts: dict[str, _Job] = {}
        band, after = None, 0
        for job in self.queue:
            if band is not None:
                after += 1
                if after > FAIR_LOOKAHEAD or job.key[0] != band:
                    break
            if job.submitter not in firsts and self._eligible(slot, job):
                firsts[job.submitter] = job
                band = job.key[0] if band is None else band
                if self.held.get(job.submitter, 0) == 0:
                    break  # no one holds fewer leases than none
        if not firsts:
            return None
        pick = min(firsts.values(), key=lambda j: (self.held.get(j.submitter, 0), j.key))
        return self._warmer(slot, pick) or pick

    def _warmer(self, slot: Any, pick: _Job) -> _Job | None:
        if not slot.warm or _is_warm(slot, pick.task) or self.now - pick.ready_s > AFFINITY_WAIT_S:
            return None
        rank = self.queue.index(pick)
        for job in self.queue[rank + 1 : rank + 1 + AFFINITY_LOOKAHEAD]:
            if (
                job.key[0] == pick.key[0]
                and job.submitter == pick.submitter
                and _is_warm(slot, job.task)
                and self._eligible(slot, job)
            ):
                return job
        return None

    def _deal_declines(self, slot: Any, job: _Job) -> bool:
        """A tile is left to faster peers that would end all of its step's queued tiles first."""
        if job.tile is None:
            return False
        render, step = _render_of(job.tid), params_of(job.task).get("step")
        queued = sum(
            1
            for j in self.queue
            if j.tile is not None and _render_of(j.tid) == render and params_of(j.task).get("step") == step
        )
        reserved = self.gang.members if self.gang is not None else []  # held for a gang: not coming
        peers = [
            (max(0.0, p.free_at - self.now) if p not in self.idle else 0.0, p.seconds(job.task))
            for p in self.slots
            if p is not slot and p not in reserved and p.holds(job.task)
        ]
        return not deal_takes(queued, slot.seconds(job.task), peers)


def _render_of(tid: str) -> str:
    """A planned task's render: its id's first part (`render.stage...`)."""
    return tid.split(".", 1)[0] if "." in tid else ""


def _is_warm(slot: Any, task: Mapping) -> bool:
    needs = params_of(task).get("needs") or task.get("needs") or []
    return set(needs) <= set(slot.warm)
