"""A render's plan before anything is queued: stages, tiles, who takes what, seconds and peaks. Pure.

Why: `farm plan` answers "how long, on which Macs, and does it fit" from the same planner, cost model
and pull-scheduling simulation the ETA uses, for the live fleet or a described one (`--fleet FILE`).
"""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from pathlib import Path

from coordinator.plan import costs, placement
from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import CAPABILITY, SpecError
from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from coordinator.plan.sp_degree import LINKS
from coordinator.views.metrics import STAGE_LABELS, stage_of

GB = 2**30
# Stage 1 in `farm plan`: sequence parallel, its degree chosen at lease time, the Macs linked by 10 GbE
# (the slower of the two links README names; Thunderbolt 5 only shortens stage 1).
PLAN_SP = placement.SpRule(LINKS["10gbe"])


def read_fleet(path: Path) -> list[dict]:
    """A described fleet (JSON or TOML): `[[workers]]` with name, chip, memory_gb, count, optional
    packs and pack_gb (default: every pack, a full-size q8 pack's bytes)."""
    text = path.read_text()
    data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    rows = data.get("workers") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not rows:
        raise SpecError(f"{path}: no workers (give a list, or a 'workers' table of name, chip, memory_gb, count)")
    return [dict(r) for r in rows]


def described_fleet(rows: list[dict], pack: str) -> tuple[Fleet, list[placement.Slot]]:
    """The fleet the planner validates against, and the slots the simulation places on."""
    caps, slots = [], []
    for i, r in enumerate(rows):
        memory = int(float(r.get("memory_gb") or 0) * GB)
        pack_bytes = int(float(r.get("pack_gb") or 0) * GB) or costs.REF_PACK_BYTES
        packs = list(r.get("packs") or [pack])
        count = max(1, int(r.get("count") or 1))
        caps += [{"packs": packs, "memory_bytes": memory, "chip": r.get("chip") or "",
                  "pack_bytes": {p: pack_bytes for p in packs},
                  **({"pack_generation": {p: str(r["generation"]) for p in packs}} if r.get("generation") else {})
                  }] * count
        if pack in packs:
            slots.append(placement.Slot(str(r.get("name") or r.get("chip") or f"mac{i + 1}"), str(r.get("chip") or ""),
                                        memory, {}, count=count))
    return Fleet.of(caps), placement.expand(slots)


def live_fleet(rows: list[dict]) -> tuple[Fleet, list[placement.Slot]]:
    """The live workers (`farm workers --json` rows) as the planner's fleet and slots with measured ratios."""
    caps, slots = [], []
    for w in rows:
        if w.get("state") not in ("idle", "busy"):
            continue
        packs = w.get("packs") or {}
        caps.append({"packs": list(packs), "memory_bytes": int(w.get("memory_bytes") or 0), "chip": w.get("chip"),
                     "pack_components": {p: c for p, c in packs.items() if c is not None},
                     "pack_generation": w.get("pack_generation") or {}, "pack_bytes": w.get("pack_bytes") or {},
                     "text_encoders": w.get("text_encoders") or {}})
        slots.append(placement.Slot(str(w["id"]), str(w.get("chip") or ""), int(w.get("memory_bytes") or 0),
                                    dict(w.get("cost_ratios") or {})))
    return Fleet.of(caps), slots


def forecast(raw_spec: dict, fleet: Fleet, slots: list[placement.Slot],
             sp: placement.SpRule | None = PLAN_SP) -> dict:
    """The plan and its predictions; SpecError (the submit refusal, with numbers) when it cannot run."""
    plan = validate_spec(normalize_spec(raw_spec), fleet)
    tasks = plan_render(plan, "plan")
    spec = plan.as_dict()
    placed = placement.simulate(tasks, slots, sp=sp)
    if len([p for p in placed if p.slot != placement.COORDINATOR_SLOT]) < sum(
            t["capability"] == CAPABILITY for t in tasks):
        raise SpecError("no worker of this fleet can hold some of its tasks (see peaks with --json)")
    by_id = {t["id"]: t for t in tasks}
    order = {tid: i for i, tid in enumerate(by_id)}  # rows in plan order (the simulation lists lease order)
    return {"spec": spec, "stages": _stages(sorted(placed, key=lambda p: order[p.task]), by_id), "total_s": max((p.end for p in placed), default=0.0),
            "tiles": {"stage2": spec.get("stage2_tiles"), "decode": spec.get("decode_tiles")},
            "workers": [{"name": s.name, "chip": s.chip, "memory_bytes": s.memory_bytes} for s in slots]}


def _stages(placed: list[placement.Placed], by_id: dict[str, dict]) -> list[dict]:
    """Per stage, in plan order: tasks by kind, who takes how many, start/end, the largest peak."""
    out: dict[str, dict] = {}
    for p in placed:
        stage = stage_of(p.kind, p.task)
        row = out.setdefault(stage, {"stage": stage, "label": STAGE_LABELS.get(stage, stage), "kinds": Counter(),
                                     "workers": Counter(), "start_s": p.start, "end_s": p.end, "peak_bytes": 0,
                                     "streamed": Counter(), "degree": 1})
        row["kinds"][p.kind] += 1
        row["degree"] = max(row["degree"], p.degree)  # stage 1's sequence-parallel degree at lease time
        for name in (p.slot, *p.gang):
            row["workers"][name] += 1
        row["streamed"][p.slot] += int(p.streamed)
        row["start_s"], row["end_s"] = min(row["start_s"], p.start), max(row["end_s"], p.end)
        row["peak_bytes"] = max(row["peak_bytes"], int(by_id[p.task]["params"].get("peak_bytes") or 0))
    return [{**r, "kinds": dict(r["kinds"]), "workers": dict(r["workers"]),
             "streamed": {w: n for w, n in r["streamed"].items() if n}} for r in out.values()]
