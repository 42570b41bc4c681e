"""A measured render's wall time split along its critical path, from the tasks' store timestamps. Pure.

Why: a speed-up below the goal is only useful with a name for what was lost. Walking back from the
task that ended last, each task waited for whichever ended last of its dependencies and the task its
worker ran before it; the chain of those tasks and the gaps between them covers the wall time from the
first submit to the last render's end exactly, so every second is one of: a stage's compute, its model
loads, its transfers, the worker's own overhead around a task, a coordinator step, an idle gap (ready
but not leased), or the assembly after the last task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PARTS = ("compute", "load", "transfer", "worker overhead", "coordinator", "idle gap", "assembly")


@dataclass(frozen=True)
class Segment:
    """A stretch of the critical path: `part` of `stage` (a task's id stage, or "" for gaps), seconds."""

    stage: str
    part: str
    seconds: float


def _stage(task_id: str) -> str:
    """The stage word of a task id (`<render>.stage2.s0.t1` → stage2)."""
    parts = task_id.split(".")
    return parts[1] if len(parts) > 1 else task_id


def compute_seconds(metrics: Mapping) -> float:
    """A task's compute: its measured seconds less its model loads (what the model learns and the path
    and the per-kind comparison count as compute)."""
    return max(0.0, float(metrics.get("seconds") or 0.0) - float(metrics.get("load_s") or 0.0))


def _task_parts(task: Mapping) -> list[Segment]:
    """A task's leased→done seconds as compute, load, transfer and the rest (worker overhead); a
    coordinator task is one coordinator part."""
    stage = _stage(str(task["id"]))
    held = max(0.0, (int(task["done_ms"]) - int(task["leased_ms"])) / 1000.0)
    if task.get("capability") == "coordinator":
        return [Segment(stage, "coordinator", held)]
    m = task.get("metrics") or {}
    load = min(held, max(0.0, float(m.get("load_s") or 0.0)))
    compute = min(held - load, compute_seconds(m))
    transfer = min(held - load - compute, float(m.get("fetch_s") or 0.0) + float(m.get("upload_s") or 0.0))
    rest = held - load - compute - transfer
    return [Segment(stage, p, s) for p, s in (("compute", compute), ("load", load), ("transfer", transfer),
                                               ("worker overhead", rest))]


def _predecessor(task: Mapping, done: dict[str, Mapping], by_worker: dict[str, list[Mapping]]) -> Mapping | None:
    """What `task` waited for: the latest-ending of its deps and its worker's previous task."""
    leased = int(task["leased_ms"])
    candidates = [done[d] for d in task.get("deps") or [] if d in done]
    if task.get("capability") != "coordinator":
        candidates += [t for t in by_worker.get(str(task.get("worker")), [])
                       if t is not task and int(t["done_ms"]) <= leased]
    candidates = [t for t in candidates if int(t["done_ms"]) <= leased]
    return max(candidates, key=lambda t: int(t["done_ms"]), default=None)


def critical_path(tasks: list[Mapping], start_ms: int, end_ms: int) -> list[Segment]:
    """The segments from `start_ms` (first submit) to `end_ms` (last render finished), oldest first.
    Only done tasks with both timestamps count; their seconds plus the gaps sum to the wall time."""
    done = {str(t["id"]): t for t in tasks if t.get("state", "done") == "done"
            and int(t.get("leased_ms") or 0) and int(t.get("done_ms") or 0)}
    if not done:
        return [Segment("", "idle gap", (end_ms - start_ms) / 1000.0)]
    by_worker: dict[str, list[Mapping]] = {}
    for t in done.values():
        if t.get("capability") != "coordinator":
            by_worker.setdefault(str(t.get("worker")), []).append(t)
    task: Mapping | None = max(done.values(), key=lambda t: int(t["done_ms"]))
    out = [Segment("", "assembly", max(0, end_ms - int(task["done_ms"])) / 1000.0)]
    while task is not None:
        out += reversed(_task_parts(task))
        before = _predecessor(task, done, by_worker)
        since = int(before["done_ms"]) if before is not None else start_ms
        out.append(Segment("", "idle gap", max(0, int(task["leased_ms"]) - since) / 1000.0))
        task = before
    return list(reversed(out))


def by_part(segments: list[Segment]) -> dict[str, float]:
    """Seconds per part (PARTS order), summed over the path."""
    return {p: round(sum(s.seconds for s in segments if s.part == p), 3) for p in PARTS}


def by_stage(segments: list[Segment]) -> dict[str, float]:
    """Seconds per stage of the tasks on the path, in path order (gaps and assembly left out)."""
    out: dict[str, float] = {}
    for s in segments:
        if s.stage:
            out[s.stage] = round(out.get(s.stage, 0.0) + s.seconds, 3)
    return out


def compute_per_kind(tasks: list[Mapping]) -> dict[str, float]:
    """Mean compute seconds (loads left out) per task kind, of the worker tasks that ran alone (a gang's
    stage 1 is not the same work as one worker's)."""
    sums: dict[str, list[float]] = {}
    for t in tasks:
        m = t.get("metrics") or {}
        if t.get("capability") == "coordinator" or t.get("state", "done") != "done" or "seconds" not in m:
            continue
        if int(m.get("stage1_parallel") or 1) > 1:
            continue
        sums.setdefault(str(t["kind"]), []).append(compute_seconds(m))
    return {k: round(sum(v) / len(v), 3) for k, v in sums.items()}


def slowdown(one: list[Mapping], many: list[Mapping]) -> dict[str, float]:
    """Per kind run alone on both sides: how much longer the N-worker run's tasks computed than the same
    tasks on 1 worker (0.1: 10 % longer). Both sides run the same plan, so a kind slower on N workers is
    what the cores lost to each other (shared caches, clocks, the coordinator beside them), not the plan."""
    a, b = compute_per_kind(one), compute_per_kind(many)
    return {k: round(b[k] / a[k] - 1, 3) for k in a if k in b and a[k] > 0}
