"""The fleet as the cost model sees it, read from the store: live workers with their measured ratios.

Why: the ETA (`farm ls`, `farm status`, the dashboard, `farm watch`) and `farm plan` on the live
fleet simulate the same workers. Plain reads; the ratios are written by complete.lua
(`{p}:costratio:{worker}` and `{p}:costratio_fleet`: EWMA of lease-to-done / reference seconds).
"""

from __future__ import annotations

import json
from typing import Any

from coordinator.plan.costs import fill_ratios
from coordinator.plan.placement import COORDINATOR_SLOT, Slot

LIVE = ("idle", "busy")


def _ratios(raw: dict) -> dict[str, float]:
    out = {}
    for kind, value in (raw or {}).items():
        try:
            out[str(kind)] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def cost_ratios(store: Any, worker_ids: list[str], what: str = "costratio",
                ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Each worker's measured ratio per kind (what="costload": cold-start seconds), and the fleet's."""
    each, fleet = store.cost_ratio_hashes(worker_ids, what)
    return {wid: _ratios(raw) for wid, raw in zip(worker_ids, each, strict=True)}, _ratios(fleet)


def _warm(worker: dict) -> list[str]:
    try:
        models = json.loads(worker.get("models") or "[]")
    except ValueError:
        return []
    return [str(m) for m in models] if isinstance(models, list) else []


def slots(workers: list[dict], ratios: tuple[dict, dict], loads: tuple[dict, dict]) -> list[Slot]:
    """One slot per worker: its own ratios and loads, a kind it never ran from the others' scaled to its
    speed (costs.fill_ratios; the fleet's EWMA when no worker measured it), and its warm models."""
    out, filled = [], fill_ratios({str(w["id"]): ratios[0].get(str(w["id"]), {}) for w in workers})
    for w in workers:
        info, wid = (w.get("info") if isinstance(w.get("info"), dict) else {}), str(w["id"])
        out.append(Slot(wid, str(info.get("chip") or ""), int(info.get("memory_bytes") or 0),
                        {**ratios[1], **filled[wid]}, warm=_warm(w),
                        loads={**loads[1], **loads[0].get(wid, {})}))
    return out


def live_slots(store: Any, now_ms: int) -> tuple[list[Slot], Slot]:
    """The live workers' slots (not lost, draining or drained) and the coordinator's."""
    from coordinator.metrics import worker_state

    workers = [w for w in store.list_workers() if worker_state(w, now_ms) in LIVE]
    ids = [str(w["id"]) for w in workers] + [COORDINATOR_SLOT]
    ratios, loads = cost_ratios(store, ids), cost_ratios(store, ids, "costload")
    coordinator = Slot(COORDINATOR_SLOT, ratios={**ratios[1], **ratios[0].get(COORDINATOR_SLOT, {})})
    return slots(workers, ratios, loads), coordinator
