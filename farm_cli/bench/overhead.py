"""Where the farm's stage-2 time goes beyond the in-process run (`farm bench overhead`'s breakdown).

From a farm render's events (task_leased / task_done, Redis clock, ms) the stage-2 wall time splits
into: the worker's tile forwards (its own compute seconds), moving the tile tensors (the worker's
fetch_s + upload_s), the coordinator's reducer tasks (cut, blend + sampler step), the rest of each
leased span (decode/encode, RPCs), and the gaps when no stage-2 task is leased at all (scheduling
latency: a ready task waiting to be leased). The in-process run has only forwards and reducer steps.
"""

from __future__ import annotations

PARTS = ("forward", "transfer", "reducer", "in-task other", "gaps")


def _spans(events: list[dict], is_stage2) -> dict[str, tuple[float, float, dict]]:
    """task id -> (leased ms, done ms, task_done metrics) of the stage-2 tasks' last attempts."""
    leased: dict[str, float] = {}
    spans: dict[str, tuple[float, float, dict]] = {}
    for e in events:
        task = str(e.get("task"))
        if not is_stage2(task):
            continue
        if e.get("type") == "task_leased":
            leased[task] = float(e["ts"])
        elif e.get("type") == "task_done" and task in leased:
            spans[task] = (leased[task], float(e["ts"]), e.get("metrics") or {})
    return spans


def farm_breakdown(events: list[dict], is_stage2, reducer_worker: str = "coordinator") -> dict[str, float]:
    """Seconds per part of PARTS over one farm render's stage 2."""
    spans = _spans(events, is_stage2)
    workers = {e.get("task"): e.get("worker") for e in events if e.get("type") == "task_done"}
    out = dict.fromkeys(PARTS, 0.0)
    for task, (start, end, metrics) in spans.items():
        length = (end - start) / 1000.0
        if workers.get(task) == reducer_worker:
            out["reducer"] += length
            continue
        forward = float(metrics.get("seconds") or 0.0)
        transfer = float(metrics.get("fetch_s") or 0.0) + float(metrics.get("upload_s") or 0.0)
        out["forward"] += forward
        out["transfer"] += transfer
        out["in-task other"] += max(0.0, length - forward - transfer)
    covered, last = 0.0, None  # union of the leased spans; the rest of the wall is gaps
    for start, end, _ in sorted(spans.values()):
        if last is None or start >= last:
            covered += end - start
            last = end
        elif end > last:
            covered += end - last
            last = end
    if spans:
        wall = max(e for _, e, _ in spans.values()) - min(s for s, _, _ in spans.values())
        out["gaps"] = max(0.0, wall - covered) / 1000.0
    return out


def breakdown_lines(farm: list[dict[str, float]], local_forward: list[float], local_reducer: list[float]) -> list[str]:
    """Median seconds per part, farm beside in-process."""
    import statistics

    med = statistics.median
    lines = [f"{'where stage 2 goes (s)':24}{'in-process':>12}{'farm (1 worker)':>18}"]
    local = {"forward": med(local_forward), "reducer": med(local_reducer)}
    for part in PARTS:
        mine = f"{local[part]:>12.3f}" if part in local else f"{'-':>12}"
        lines.append(f"{part:24}{mine}{med(f[part] for f in farm):>18.3f}")
    return lines
