"""The schedule the dashboard draws as a Gantt view, and the farm's event feed, read from the store.

Why: operators read a farm from its schedule (Deadline's, Flamenco's): which Mac ran what, when, and
where a lease was lost or a task retried. Every lease that ended is one attempt row, written by the
Lua script that ended it (common.lua record_attempt: worker, attempt, start, end, outcome); the leases
running now are read from the task hashes. Both become bars on a lane per worker, for one render or
for the whole farm over a window (the last hour). Times are the Redis clock's, as everywhere.
"""

from __future__ import annotations

from typing import Protocol

from coordinator.views.metrics import STAGE_LABELS, STAGES, stage_of, task_workers
from protos.kinds import facts

FARM_WINDOW_MIN = 60
FARM_MAX_BARS = 4000  # the newest attempts a farm view carries (a page refreshes it every few seconds)
LOST = ("lost", "expired")  # a lease that ended without a result: no attempt spent (README's policy)


class ScheduleStore(Protocol):
    def now_ms(self) -> int: ...

    def render_attempts(self, render_id: str) -> list[dict]: ...

    def farm_attempts(self, since_ms: int) -> list[dict]: ...

    def render_tasks(self, render_id: str) -> list[dict]: ...

    def leased_tasks(self) -> list[dict]: ...

    def read_feed(self, count: int = 100) -> list[dict]: ...


def _bar(row: dict, retried: set[str]) -> dict:
    """One attempt as a bar: its task's short name, stage (the colour), worker, times and outcome."""
    task, kind = str(row.get("task", "")), str(row.get("kind", ""))
    render = str(row.get("render", ""))
    name = task[len(render) + 1:] if render and task.startswith(render + ".") else task
    stage = stage_of(kind, task)
    return {"task": task, "render": render, "name": name, "kind": kind, "what": facts(kind).label or kind,
            "stage": stage, "stage_label": STAGE_LABELS.get(stage, stage), "worker": str(row.get("worker", "")),
            "attempt": int(row.get("attempt") or 0), "start_ms": int(row.get("start_ms") or 0),
            "end_ms": int(row.get("end_ms") or 0), "outcome": str(row.get("outcome", "")), "rank": row.get("rank"),
            "again": task in retried and row.get("outcome") != "running"}


def _running(tasks: list[dict], now_ms: int) -> list[dict]:
    """The leases running now, as attempt rows: one per rank of a gang (each rank's worker computes)."""
    return [{"task": t["id"], "render": t.get("render", ""), "kind": t.get("kind", ""), "worker": w,
             "attempt": t.get("attempts", 0), "start_ms": t.get("leased_ms") or now_ms, "end_ms": now_ms,
             "outcome": "running", **({"rank": r} if len(task_workers(t)) > 1 else {})}
            for t in tasks if t.get("state") == "leased" and t.get("worker") for r, w in enumerate(task_workers(t))]


def lanes(rows: list[dict], now_ms: int, start_ms: int | None = None) -> dict:
    """Bars by worker (the coordinator's own lane last), the window they span and the marks' counts.
    A task with more than one attempt row is marked on each of its bars (`again`): a retry or a lost lease."""
    counts: dict[str, int] = {}
    for r in rows:
        if not r.get("rank"):  # a gang's attempt is one row per rank: count it once
            counts[str(r.get("task"))] = counts.get(str(r.get("task")), 0) + 1
    retried = {t for t, n in counts.items() if n > 1}
    bars = sorted((_bar(r, retried) for r in rows), key=lambda b: (b["start_ms"], b["task"]))
    by_worker: dict[str, list[dict]] = {}
    for b in bars:
        by_worker.setdefault(b["worker"], []).append(b)
    order = sorted(by_worker, key=lambda w: (w == "coordinator" or w.startswith("coordinator"), w))
    first = min((b["start_ms"] for b in bars), default=now_ms)
    return {
        "start_ms": min(first, start_ms) if start_ms is not None else first,
        "end_ms": max([now_ms if any(b["outcome"] == "running" for b in bars) else 0,
                       *(b["end_ms"] for b in bars)], default=now_ms) if bars else now_ms,
        "now_ms": now_ms,
        "lanes": [{"worker": w, "bars": by_worker[w]} for w in order],
        "stages": [[s, label] for s, label in STAGES if any(b["stage"] == s for b in bars)],  # the legend
        "marks": {"failed": sum(b["outcome"] == "failed" for b in bars),
                  "lost": sum(b["outcome"] in LOST for b in bars), "retried": len(retried)},
    }


def render_schedule(store: ScheduleStore, render_id: str) -> dict:
    """The render's Gantt: every ended attempt of its tasks and the ones running now."""
    now = store.now_ms()
    return lanes(store.render_attempts(render_id) + _running(store.render_tasks(render_id), now), now)


def farm_schedule(store: ScheduleStore, minutes: int = FARM_WINDOW_MIN) -> dict:
    """The farm's Gantt over the last `minutes`: every attempt that ended in it, and what runs now."""
    now = store.now_ms()
    since = now - minutes * 60_000
    rows = [r for r in store.farm_attempts(since) if int(r.get("end_ms") or 0) >= since][-FARM_MAX_BARS:]
    out = lanes(rows + _running(store.leased_tasks(), now), now)
    # The window ends now and starts where the hour's first bar does (the whole hour when it was busy
    # from its start): a farm that rendered for two minutes is not drawn as slivers at the right edge.
    out.update(start_ms=max(since, min(out["start_ms"], now - 60_000)), end_ms=now, window_start_ms=since)
    return out


FEED_WORDS = {
    "worker_lost": "{worker} lost ({reason})",
    "lease_lost": "{task_name} lost its lease on {worker} ({reason}); queued again, no attempt spent",
    "task_retried": "{task_name} failed on {worker}, retried: {error}",
    "task_failed": "{task_name} failed on {worker}: {error}",
    "worker_blocklisted": "{worker} blocklisted for {render} after {failures} failed tasks",
    "worker_draining": "{worker} draining: finishes its task, takes no more",
    "worker_drained": "{worker} drained and left",
}


def feed_line(event: dict) -> str:
    values = {k: "" for k in ("worker", "reason", "task", "error", "render", "failures")}
    values.update({k: v for k, v in event.items() if v is not None})
    task, render = str(values["task"]), str(values["render"])
    values["task_name"] = task[len(render) + 1:] if render and task.startswith(render + ".") else task
    return FEED_WORDS.get(str(event.get("type")), "{type}").format(**values)[:400]


def feed(store: ScheduleStore, render_id: str | None = None, count: int = 50) -> list[dict]:
    """The newest events of the farm's feed (of one render's, when given), each with its line."""
    events = store.read_feed(400 if render_id else count)
    if render_id:
        events = [e for e in events if e.get("render") == render_id or str(e.get("task", "")).startswith(render_id + ".")]
    return [{**e, "line": feed_line(e)} for e in events[:count]]
