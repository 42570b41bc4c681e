"""The one ETA: every unfinished render's seconds left, computed for the whole farm at once.

Why one place: the dashboard's list and detail, `farm ls`, `farm status` and `farm watch` used to each
run the cost model on their own (the list reused one fleet for every row, so each row waited behind the
rows above it, in list order; the detail ran its render alone), and showed 11 s and 4.8 s for the same
render. Here the live fleet takes every unfinished render's tasks in the order the scheduler deals them
(priority, then age) in one simulation (`placement.farm_eta_seconds`: lease.lua's rules, lease_sim.py),
so a queued render waits behind those before it, whoever asks, and a worker idle behind it backfills. Every reader calls `farm_etas` and shows `eta_s` (seconds from the
Redis clock's `now_ms`) or `eta_ms` (the Redis-clock time it is predicted done).

Fallbacks, per render, when the plan carries no costs: measured per-kind speeds when every kind left
has one, else linear in elapsed time.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol

from coordinator.plan import placement
from coordinator.views.fleet import FleetStore, live_slots, worker_state
from coordinator.views.progress import STAGES, eta_from_speeds
from protos.states import TERMINAL

FRESH_S = 1.0  # the farm's ETAs are simulated at most this often (per store)
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
ACTIVE_SCAN = 500  # newest renders looked at for unfinished ones (the farm's queue is far shorter)
Rows = dict[str, tuple[dict, list[dict]]]  # render id -> (render record, task views)


class EtaStore(FleetStore, Protocol):
    def list_renders(self, limit: int = 50) -> list[dict]: ...

    def render_tasks(self, render_id: str) -> list[dict]: ...

    def kind_times(self, kinds: list[str]) -> dict[str, tuple[int, float]]: ...


def fraction(views: list[dict]) -> float:
    """Done share of the task graph, counting running tasks by their step progress."""
    if not views:
        return 0.0
    total = 0.0
    for v in views:
        if v["display"] == "done":
            total += 1.0
        elif v["display"] == "running" and v["progress"].get("total"):
            total += min(1.0, float(v["progress"]["step"]) / float(v["progress"]["total"]))
    return total / len(views)


def kind_speeds(store: EtaStore, kinds: set[str]) -> dict[str, float]:
    """Mean lease-to-done seconds per task kind, measured by the farm (kinds never finished are left out)."""
    return {kind: sum_ms / n / 1000.0 for kind, (n, sum_ms) in store.kind_times(sorted(kinds)).items()}


def live_worker_count(store: FleetStore, now_ms: int) -> int:
    """Workers that can take a task now (not lost, draining or drained): the fallback's parallelism."""
    return sum(worker_state(w, now_ms) in ("idle", "busy") for w in store.list_workers())


def _order(row: tuple[dict, list[dict]]) -> tuple:
    render = row[0]
    return -int(render.get("priority") or 0), int(render.get("created_ms") or 0), str(render.get("id"))


def unfinished_rows(store: EtaStore, known: Rows, view: Callable[[dict], dict]) -> list[tuple[dict, list[dict]]]:
    """Every unfinished render with its task views (those in `known` as given), in scheduling order."""
    rows = {rid: row for rid, row in known.items() if row[0].get("state") not in TERMINAL}
    for render in store.list_renders(ACTIVE_SCAN):
        if render.get("state") not in TERMINAL and render["id"] not in rows:
            rows[render["id"]] = (render, [view(t) for t in store.render_tasks(render["id"])])
    return sorted(rows.values(), key=_order)


def farm_etas(store: EtaStore, now_ms: int, known: Rows, view: Callable[[dict], dict]) -> dict[str, float | None]:
    """Seconds left for every unfinished render (finished ones are absent: no ETA). `known`: rows the
    caller has read already; `view`: metrics.task_view, for the renders it has not. Computed at most
    once per FRESH_S for the whole farm (every reader in that second gets the same numbers, and a crowd
    of `farm watch`es costs one simulation), unless a render asked about is not in it yet."""
    with _LOCK:
        cached = _CACHE.get(store)
        if cached and time.monotonic() - cached[0] < FRESH_S and all(
                rid in cached[1] for rid, row in known.items() if row[0].get("state") not in TERMINAL):
            return cached[1]
    etas = _compute(store, now_ms, known, view)
    with _LOCK:
        _CACHE[store] = (time.monotonic(), etas)
    return etas


def _compute(store: EtaStore, now_ms: int, known: Rows, view: Callable[[dict], dict]) -> dict[str, float | None]:
    rows = unfinished_rows(store, known, view)
    slots, coordinator = live_slots(store, now_ms)
    meta = [(int(float(r.get("priority") or 0)), str(r.get("submitter") or "")) for r, _ in rows]
    modelled = placement.farm_eta_seconds([vs for _, vs in rows], slots, now_ms, coordinator, meta)
    speeds = kind_speeds(store, {v["kind"] for _, vs in rows for v in vs})
    workers = live_worker_count(store, now_ms)
    return {render["id"]: render_eta(render, vs, now_ms, model, coordinator, speeds, workers)
            for (render, vs), model in zip(rows, modelled, strict=True)}


def render_eta(render: dict, views: list[dict], now_ms: int, modelled: float | None,
               coordinator: placement.Slot | None, speeds: dict[str, float] | None, workers: int) -> float | None:
    """One render's ETA from the farm's simulation (`modelled`, plus its assembly), else the fallbacks."""
    if render.get("state") in TERMINAL:
        return None
    spec = render.get("spec") if isinstance(render.get("spec"), dict) else {}
    mux = coordinator.seconds({"kind": "assemble", "cost_s": float(spec.get("assemble_s") or 0.0)}) \
        if coordinator is not None else 0.0
    if render.get("state") == "assembling":
        return max(0.1 * mux, mux - (now_ms - int(render.get("assembling_ms") or now_ms)) / 1000.0)
    if modelled is not None:
        return modelled + mux
    if speeds is not None:
        measured = eta_from_speeds(views, [s for s, _ in STAGES], speeds, workers, now_ms)
        if measured is not None:
            return measured
    frac, started = fraction(views), int(render.get("started_ms") or 0)
    return (now_ms - started) / 1000.0 * (1 - frac) / frac if started and 0 < frac < 1 else None

