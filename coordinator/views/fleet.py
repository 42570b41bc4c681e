"""The fleet read from the store: the one reading of a worker's state, the worker rows `farm workers`
and the dashboard show, and the live workers with their measured ratios as the cost model sees them.

Why: the ETA (`farm ls`, `farm status`, the dashboard, `farm watch`) and `farm plan` on the live
fleet simulate the same workers the rows show. Plain reads; the ratios are written by complete.lua
(`{p}:costratio:{worker}` and `{p}:costratio_fleet`: EWMA of lease-to-done / reference seconds).
Split from metrics.py (the size rule, and metrics read worker_state while this read metrics').
"""

from __future__ import annotations

import json
from typing import Protocol

from coordinator.plan.costs import fill_ratios
from coordinator.plan.placement import COORDINATOR_SLOT, Slot

LIVE = ("idle", "busy")
LOST_AFTER_MS = 90_000  # a worker unseen this long is shown as lost


class FleetStore(Protocol):
    """The store reads the fleet's rows and slots are built from (coordinator/state/reads.py)."""

    def now_ms(self) -> int: ...

    def list_workers(self) -> list[dict]: ...

    def cost_ratio_hashes(self, worker_ids: list[str], what: str = "costratio",
                          ) -> tuple[list[dict[str, str]], dict[str, str]]: ...


def _ratios(raw: dict) -> dict[str, float]:
    out = {}
    for kind, value in (raw or {}).items():
        try:
            out[str(kind)] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def cost_ratios(store: FleetStore, worker_ids: list[str], what: str = "costratio",
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


def live_slots(store: FleetStore, now_ms: int) -> tuple[list[Slot], Slot]:
    """The live workers' slots (not lost, draining or drained) and the coordinator's."""
    workers = [w for w in store.list_workers() if worker_state(w, now_ms) in LIVE]
    ids = [str(w["id"]) for w in workers] + [COORDINATOR_SLOT]
    ratios, loads = cost_ratios(store, ids), cost_ratios(store, ids, "costload")
    coordinator = Slot(COORDINATOR_SLOT, ratios={**ratios[1], **ratios[0].get(COORDINATOR_SLOT, {})})
    return slots(workers, ratios, loads), coordinator


def worker_state(worker: dict, now_ms: int) -> str:
    """The one reading of a worker's state, for `farm workers` and the dashboard alike: refused (turned
    away at registration), drained (it exited after a drain), lost (its connection broke, or unseen for LOST_AFTER_MS), draining (finishing
    its task before it exits), else busy or idle as it last reported."""
    state = str(worker.get("state") or "idle")
    if worker.get("refused"):  # turned away at registration (another project version): it takes nothing
        return "refused"
    draining = str(worker.get("drain") or "0") == "1"
    if draining and state == "drained":
        return "drained"
    seen = int(worker.get("last_seen_ms") or 0)
    if state == "lost" or (seen and now_ms - seen > LOST_AFTER_MS):
        return "lost"
    return "draining" if draining else state


def blocklisted_for(worker: dict) -> list[str]:
    """Renders this worker is blocklisted for (it failed too many of their tasks)."""
    value = worker.get("blocklisted") or []  # FarmStore decodes it to a list; a raw hash holds the words
    return list(value) if isinstance(value, list) else str(value).split()


def worker_view(worker: dict, now_ms: int) -> dict:
    """A worker row: host, chip, memory, device, state (worker_state), blocklists, tiles done, mean s/tile."""
    info = worker.get("info") if isinstance(worker.get("info"), dict) else {}
    seen = int(worker.get("last_seen_ms") or 0)
    state = worker_state(worker, now_ms)
    done = int(worker.get("tasks_done") or 0)
    return {
        "id": worker["id"],
        "host": info.get("host") or info.get("hostname") or info.get("peer") or "",
        "chip": info.get("chip") or "",
        "memory_bytes": info.get("memory_bytes"),
        "mlx_device": info.get("mlx_device") or "",
        "os": info.get("os") or "",
        "state": state,
        "refused": worker.get("refused") or "",
        **{k: info.get(k) or "" for k in ("project_version", "mlx_version", "backend", "fingerprint")},
        "installed": info.get("installed") if isinstance(info.get("installed"), dict) else {},
        "blocklisted_for": blocklisted_for(worker),
        "current_task": worker.get("current_task") or "",
        "packs": {p: (info.get("pack_components") or {}).get(p) for p in info.get("packs") or []},
        "text_encoders": info.get("text_encoders") if isinstance(info.get("text_encoders"), dict) else {},
        "pack_bytes": info.get("pack_bytes") if isinstance(info.get("pack_bytes"), dict) else {},
        "pack_generation": info.get("pack_generation") if isinstance(info.get("pack_generation"), dict) else {},
        "pack_sync": worker.get("pack_sync") if isinstance(worker.get("pack_sync"), dict) else {},
        "tasks_done": done,
        "failures": int(worker.get("failures") or 0),
        "busy_s": float(worker.get("busy_s") or 0.0),
        "mean_s_per_tile": (float(worker.get("busy_s") or 0.0) / done) if done else None,
        "last_seen_ms": seen,
        "last_seen_age_s": (now_ms - seen) / 1000.0 if seen else None,
    }


def list_workers(store: FleetStore) -> list[dict]:
    """Worker rows with the cost model's measured ratios per kind (`cost_ratios`, what `farm plan` reads)."""
    now = store.now_ms()
    workers = store.list_workers()
    ratios, _fleet = cost_ratios(store, [str(w["id"]) for w in workers])
    return [{**worker_view(w, now), "cost_ratios": ratios[str(w["id"])]} for w in workers]
