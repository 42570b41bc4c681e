"""The fleet as the cost model sees it, read from the store: live workers with their measured ratios.

Why: the ETA (`farm ls`, `farm status`, the dashboard, `farm watch`) and `farm plan` on the live
fleet simulate the same workers. Plain reads; the ratios are written by complete.lua
(`{p}:costratio:{worker}` and `{p}:costratio_fleet`: EWMA of lease-to-done / reference seconds).
"""

from __future__ import annotations

from typing import Any

from coordinator.placement import COORDINATOR_SLOT, Slot

LIVE = ("idle", "busy")


def _ratios(raw: dict) -> dict[str, float]:
    out = {}
    for kind, value in (raw or {}).items():
        try:
            out[str(kind)] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def cost_ratios(store: Any, worker_ids: list[str]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Each worker's measured ratio per kind, and the fleet-wide one."""
    pipe = store.client.pipeline(transaction=False)
    for wid in worker_ids:
        pipe.hgetall(store.key("costratio", wid))
    pipe.hgetall(store.key("costratio_fleet"))
    *each, fleet = pipe.execute()
    return {wid: _ratios(raw) for wid, raw in zip(worker_ids, each, strict=True)}, _ratios(fleet)


def slots(workers: list[dict], ratios: dict[str, dict[str, float]], fleet: dict[str, float]) -> list[Slot]:
    """One slot per worker: its own ratios over the fleet's (a kind it never ran reads the fleet's)."""
    out = []
    for w in workers:
        info = w.get("info") if isinstance(w.get("info"), dict) else {}
        out.append(Slot(str(w["id"]), str(info.get("chip") or ""), int(info.get("memory_bytes") or 0),
                        {**fleet, **ratios.get(str(w["id"]), {})}))
    return out


def live_slots(store: Any, now_ms: int) -> tuple[list[Slot], Slot]:
    """The live workers' slots (not lost, draining or drained) and the coordinator's."""
    from coordinator.metrics import worker_state

    workers = [w for w in store.list_workers() if worker_state(w, now_ms) in LIVE]
    ratios, fleet = cost_ratios(store, [str(w["id"]) for w in workers] + [COORDINATOR_SLOT])
    coordinator = Slot(COORDINATOR_SLOT, ratios={**fleet, **ratios.get(COORDINATOR_SLOT, {})})
    return slots(workers, ratios, fleet), coordinator
