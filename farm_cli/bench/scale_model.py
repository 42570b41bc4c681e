"""What the cost model predicts for `farm bench scale`'s runs, from the 1-worker run alone. Pure.

Why: the planner, `farm plan` and every ETA trust coordinator/plan/costs.py and the lease simulation;
a bench that measures N workers against 1 is the place to check them. The 1-worker run teaches the
model this machine's speed as the farm itself learns it (each kind's measured seconds over its
reference `cost_s`, and its model loads); the simulation (placement.simulate, lease.lua's rules) then
places the same plan on 1 and on N such workers, a gang's gathers priced with the bench pack's DiT over
this machine's loopback (`SpRule.dims`, `link_bytes_per_s`), not a real pack's over 10 GbE; the
assembly after the last task is the 1-worker run's on both sides. Transfers, worker overheads and the
cores' slowdown beside each other are not in the model, so its error is what they and the scheduling cost.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from coordinator.plan import placement
from farm_cli.bench.critical import compute_seconds

SIM_FIELDS = ("id", "kind", "capability", "deps", "params")
STAGE1 = "denoise_stage1"


def learned(tasks: list[Mapping]) -> tuple[dict[str, float], dict[str, float]]:
    """Per kind: measured compute seconds over reference seconds, and the largest model load seen."""
    compute: dict[str, float] = defaultdict(float)
    reference: dict[str, float] = defaultdict(float)
    loads: dict[str, float] = defaultdict(float)
    for t in tasks:
        if t.get("capability") == "coordinator" or t.get("state", "done") != "done":
            continue
        m, kind = t.get("metrics") or {}, str(t["kind"])
        compute[kind] += compute_seconds(m)
        reference[kind] += float((t.get("params") or {}).get("cost_s") or 0.0)
        loads[kind] = max(loads[kind], float(m.get("load_s") or 0.0))
    ratios = {k: compute[k] / reference[k] for k in compute if reference[k] > 0}
    return ratios, dict(loads)


def _plan_order(tasks: list[Mapping]) -> list[dict]:
    """The tasks as the simulation takes them: plan fields only, in the order given (each render's plan
    order, renders in submit order, as `measure` reads them)."""
    return [{k: t.get(k) for k in SIM_FIELDS} for t in tasks]


def placed(tasks: list[Mapping], workers: int, ratios: dict[str, float], loads: dict[str, float],
           sp: placement.SpRule = placement.ETA_SP) -> list:
    """The simulation's placement of `tasks` (one or more renders) on `workers` workers of the learned
    speed; a stage 1 whose request and the idle workers allow it runs as a gang (`gang_seconds` over `sp`)."""
    slots = [placement.Slot(f"w{i + 1}", ratios=dict(ratios), loads=dict(loads)) for i in range(workers)]
    return placement.simulate(_plan_order(tasks), slots, sp=sp)


def predicted_wall(tasks: list[Mapping], workers: int, ratios: dict[str, float], loads: dict[str, float],
                   sp: placement.SpRule = placement.ETA_SP) -> float:
    """Modelled seconds for `tasks` (one or more renders) on `workers` workers of the learned speed."""
    return max((p.end for p in placed(tasks, workers, ratios, loads, sp)), default=0.0)


def _stage1(placements: list, tasks: list[Mapping]) -> dict:
    """Each stage-1 task's modelled and measured degree and seconds (leased to done, loads included)."""
    measured = {str(t["id"]): t for t in tasks if t.get("kind") == STAGE1}
    model = {p.task: p for p in placements if p.kind == STAGE1}
    ids = [i for i in measured if i in model]
    return {"degree_model": [model[i].degree for i in ids],
            "degree": [int((measured[i].get("metrics") or {}).get("stage1_parallel") or 1) for i in ids],
            "model_s": [round(model[i].end - model[i].start, 3) for i in ids],
            "measured_s": [round((int(measured[i]["done_ms"]) - int(measured[i]["leased_ms"])) / 1000, 3) for i in ids]}


def model_vs_measured(one: list[Mapping], many: list[Mapping], workers: int,
                      sp: placement.SpRule = placement.ETA_SP, assembly_s: float = 0.0) -> dict:
    """The model's 1-worker and N-worker walls and speed-up for the plan of these runs (`one`: the
    1-worker run's tasks, which teach the speed; `many`: the N-worker run's, the same plan; `sp`: the
    gang's link and DiT; `assembly_s`: the 1-worker run's assembly after its last task, which the
    coordinator runs alike on both sides, as the live ETA adds it), and its stage 1s on both sides
    beside the measured ones (degree and seconds)."""
    ratios, loads = learned(one)
    p1, pn = placed(one, 1, ratios, loads, sp), placed(many, workers, ratios, loads, sp)
    t1 = max((p.end for p in p1), default=0.0) + assembly_s
    tn = max((p.end for p in pn), default=0.0) + assembly_s
    return {"one_s": round(t1, 3), "many_s": round(tn, 3), "speedup": round(t1 / tn, 3) if tn else 0.0,
            "assembly_s": round(assembly_s, 3), "stage1": {"one": _stage1(p1, one), "many": _stage1(pn, many)}}
