"""The farm's numbers, read from the store: render/stage/tile summaries and worker rows.

The dashboard's JSON API, `farm watch` and /metrics (coordinator/views/prometheus.py) all use these functions, so a stage, a tile's
position on the frame or a worker's mean seconds per tile is computed in one place. Everything here
is a plain read of Redis (no state changes); times come from Redis TIME, the farm's one clock.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from coordinator.views import eta
from coordinator.views.fleet import FleetStore
from coordinator.views.progress import STAGES, task_label
from coordinator.views.windows import window_rows
from protos.kinds import KINDS, NO_FACTS, TaskKind, facts
from protos.states import TERMINAL

STAGE_LABELS = dict(STAGES)


class MetricsStore(FleetStore, Protocol):
    """The store reads the farm's numbers are made of (coordinator/state/reads.py), beside the fleet's."""

    def get_render(self, render_id: str) -> dict | None: ...

    def list_renders(self, limit: int = 50) -> list[dict]: ...

    def render_tasks(self, render_id: str) -> list[dict]: ...

    def blob_sizes(self, shas: list[str]) -> dict[str, int]: ...

    def kind_times(self, kinds: list[str]) -> dict[str, tuple[int, float]]: ...


def stage_of(kind: str, task_id: str = "") -> str:
    """The pipeline stage of a task: the first name in its id (`<render>.stage2.s0.t1` → stage2),
    else its kind's stage (protos/kinds.py), else the kind itself."""
    name = task_id.split(".")[1] if task_id.count(".") >= 1 else ""
    for stage, _label in STAGES:
        if name.startswith(stage):
            return stage
    known = facts(kind)
    if known is NO_FACTS:  # a word the table does not hold (another version's kind): the kind it extends
        family = max((k for k in KINDS if kind.startswith(k)), key=len, default=None)
        known = facts(family) if family else known
    return known.stage or kind or "other"


def redis_now_ms(store: FleetStore) -> int:
    return store.now_ms()


def blob_sizes(store: MetricsStore, shas: set[str]) -> dict[str, int]:
    """Sizes of blobs by sha256 (one pipelined read); unknown blobs are left out."""
    return store.blob_sizes(sorted(s for s in shas if isinstance(s, str) and s))


def shas_in(value: Any) -> list[str]:
    return [v for v in value.values() if isinstance(v, str)] if isinstance(value, dict) else []


def display_state(task: dict) -> str:
    """queued / leased / running / done / failed / retried / waiting / cancelled, as the UI colours it."""
    state = str(task.get("state") or "")
    progress = task.get("progress") if isinstance(task.get("progress"), dict) else {}
    if state == "queued" and int(task.get("attempts") or 0) > 0:
        return "retried"
    if state == "leased":  # leased: handed out, inputs still on the way; running: the worker computes it
        return "running" if progress.get("step") is not None or progress.get("phase") == "run" else "leased"
    return state or "waiting"


def task_workers(task: dict) -> list[str]:
    """Every worker the task ran on: a sequence-parallel gang's ranks (rank 0, the holder, first), else
    its one worker; rank 0 reports for the gang, but each rank computed a share."""
    worker = str(task.get("worker") or "")
    ranks = [str(w) for w in task.get("ranks") or []]
    return ranks if len(ranks) > 1 and ranks[0] == worker else [worker] if worker else []


def task_view(task: dict, sizes: dict[str, int] | None = None) -> dict:
    """A task as the dashboard and `farm watch` show it: stage, display state, tile, timings, bytes."""
    params = task.get("params") if isinstance(task.get("params"), dict) else {}
    metrics = task.get("metrics") if isinstance(task.get("metrics"), dict) else {}
    progress = task.get("progress") if isinstance(task.get("progress"), dict) else {}
    leased, done = int(task.get("leased_ms") or 0), int(task.get("done_ms") or 0)
    seconds = metrics.get("seconds")
    if not isinstance(seconds, (int, float)) and leased and done >= leased:
        seconds = (done - leased) / 1000.0
    sizes = sizes or {}
    tid = str(task.get("id", ""))
    return {
        "id": tid,
        "name": tid.rsplit(".", 1)[-1] if "." in tid else tid,
        "label": task_label(str(task.get("kind", "")), params.get("step"), params.get("tile_index"),
                            params.get("round")),
        "kind": task.get("kind", ""),
        "stage": stage_of(str(task.get("kind", "")), str(task.get("id", ""))),
        "state": task.get("state", ""),
        "display": display_state(task),
        "worker": task.get("worker") or "",
        "workers": task_workers(task),
        "attempts": int(task.get("attempts") or 0),
        "max_attempts": int(task.get("max_attempts") or 0),
        "error": task.get("error") or "",
        "queued_ms": int(task.get("queued_ms") or 0),
        "leased_ms": leased,
        "done_ms": done,
        "seconds": seconds,
        "progress": progress,
        "step": params.get("step"),
        "round": params.get("round"),
        "tile_index": params.get("tile_index"),
        "tile": params.get("tile") or params.get("latent"),  # a decode tile's place is its latent box
        "grid": params.get("grid"),
        "cost_s": params.get("cost_s"),  # the cost model's reference seconds (coordinator.plan.costs)
        "min_memory_bytes": params.get("min_memory_bytes"),
        "min_memory_stream_bytes": params.get("min_memory_stream_bytes"),  # a DiT task streamed (costs.py)
        "streamed": bool(metrics.get("streamed")),  # the worker ran its DiT blocks streamed
        "load_s": params.get("load_s"),
        "needs": list(params.get("needs") or []),
        "deps": list(task.get("deps") or []),
        "capability": task.get("capability"),
        "bytes_in": sum(sizes.get(s, 0) for s in shas_in(task.get("inputs"))),
        "bytes_out": sum(sizes.get(s, 0) for s in shas_in(task.get("outputs"))),
        "peak_memory_bytes": metrics.get("peak_memory_bytes"),
        "log": metrics.get("log") if isinstance(metrics.get("log"), list) else [],  # the worker's lines
        # the failure policy: raised failures and where, leases lost with a worker, flagged as stuck
        "failures": int(task.get("failures") or 0),
        "failed_on": list(task.get("failed_on") or []),
        "lost": int(task.get("lost") or 0),
        "stuck": task.get("state") == "leased" and int(task.get("stuck_ms") or 0) > 0,
    }


def _cores(intervals: list[tuple[int, int]], length: int) -> dict[tuple[int, int], tuple[float, float]]:
    """Each distinct interval's share of [0, length): overlaps split at their middle, as fractions."""
    ordered = sorted(set(intervals))
    if not ordered:
        return {}
    length = max(length, max(e for _, e in ordered), 1)
    cuts = [0.0] + [(ordered[i - 1][1] + ordered[i][0]) / 2 for i in range(1, len(ordered))] + [float(length)]
    return {iv: (cuts[i] / length, cuts[i + 1] / length) for i, iv in enumerate(ordered)}


def _interval(tile: dict, axis: str) -> tuple[int, int]:
    value = tile.get(axis) or [0, 1]
    return int(value[0]), int(value[1])


def layout_grid(tiles: list[dict]) -> dict:
    """Place tiles on the frame to scale: a row per temporal tile, (x0, x1, y0, y1) fractions per tile."""
    tiled = [t for t in tiles if isinstance(t.get("tile"), dict)]
    if not tiled:
        return {
            "aspect": None,
            "rows": [{"frames": None, "tiles": [{**t, "box": [0.0, 1.0, 0.0, 1.0]}]} for t in tiles],
        }
    grid = next((t["grid"] for t in tiled if isinstance(t.get("grid"), list) and len(t["grid"]) == 3), None)
    f_len, h_len, w_len = (int(v) for v in grid) if grid else (0, 0, 0)
    hs = _cores([_interval(t["tile"], "height") for t in tiled], h_len)
    ws = _cores([_interval(t["tile"], "width") for t in tiled], w_len)
    rows: dict[tuple[int, int], list[dict]] = {}
    for t in sorted(tiled, key=lambda t: (t.get("tile_index") is None, t.get("tile_index") or 0, t["id"])):
        y0, y1 = hs[_interval(t["tile"], "height")]
        x0, x1 = ws[_interval(t["tile"], "width")]
        rows.setdefault(_interval(t["tile"], "frames"), []).append({**t, "box": [x0, x1, y0, y1]})
    h_len = h_len or max(e for _, e in hs)
    w_len = w_len or max(e for _, e in ws)
    return {
        "aspect": h_len / w_len if w_len else None,
        "frames": f_len,
        "rows": [{"frames": list(k), "tiles": v} for k, v in sorted(rows.items())],
    }


def tile_grids(views: list[dict]) -> list[dict]:
    """One grid per tiled (stage, round, step); every untiled task is one full-frame tile of its own."""
    groups: dict[tuple, list[dict]] = {}
    for v in views:
        key = (
            (v["stage"], v["round"], v["step"]) if isinstance(v.get("tile"), dict) else (v["stage"], v["id"])
        )
        groups.setdefault(key, []).append(v)
    out = []
    for key, tiles in groups.items():
        stage = key[0]
        label = STAGE_LABELS.get(stage, stage)
        if isinstance(tiles[0].get("tile"), dict):
            rnd, step = key[1], key[2]
            label += (f" round {rnd}" if rnd is not None else "") + (
                f" step {step}" if step is not None else ""
            )
        else:
            label = f"{label} · {tiles[0]['label']}"
        done = sum(t["display"] == "done" for t in tiles)
        out.append(
            {
                "stage": stage,
                "label": label,
                "tiled": isinstance(tiles[0].get("tile"), dict),
                "done": done,
                "total": len(tiles),
                **layout_grid(tiles),
            }
        )
    return out


def _stage_state(states: Counter, all_done: bool, started: bool, ended: bool) -> str:
    """A stage's one word. A render that ended (cancelled, failed) leaves no stage running: a task the
    worker has not yet given back after the cancel still reads `leased` in the store."""
    if states["failed"]:
        return "failed"
    if all_done:
        return "done"
    if ended or (states["cancelled"] and not started):
        return "cancelled"
    return "running" if started else "queued"


def stage_summaries(render: dict, views: list[dict]) -> list[dict]:
    """The timeline: per stage counts, state, start/end and duration, in pipeline order (+ the mux)."""
    by_stage: dict[str, list[dict]] = {}
    for v in views:
        by_stage.setdefault(v["stage"], []).append(v)
    order = [s for s, _ in STAGES] + sorted(set(by_stage) - set(STAGE_LABELS))
    out = []
    for stage in order:
        tasks = by_stage.get(stage)
        if not tasks:
            continue
        states = Counter(t["display"] for t in tasks)
        started = [t["leased_ms"] for t in tasks if t["leased_ms"]]
        all_done = states["done"] == len(tasks)
        state = _stage_state(states, all_done, bool(started), render.get("state") in TERMINAL)
        finished = max((t["done_ms"] for t in tasks), default=0) if all_done else 0
        steps = [t["progress"] for t in tasks if t["display"] == "running" and state == "running"]
        out.append(
            {
                "name": stage,
                "label": STAGE_LABELS.get(stage, stage),
                "state": state,
                "done": states["done"],
                "total": len(tasks),
                "failed": states["failed"],
                "started_ms": min(started, default=0),
                "finished_ms": finished,
                "duration_s": (finished - min(started)) / 1000.0 if finished and started else None,
                "progress": steps[0] if steps else None,
            }
        )
    rstate = render.get("state")
    if views and all(v["display"] == "done" for v in views) or rstate == "assembling":
        last = max((v["done_ms"] for v in views), default=0)
        fin = int(render.get("finished_ms") or 0) if rstate == "done" else 0
        out.append(
            {
                "name": "mux",
                "label": "Mux",
                "done": int(rstate == "done"),
                "total": 1,
                "failed": 0,
                "state": {"done": "done", "failed": "failed"}.get(str(rstate), "running"),
                "started_ms": last,
                "finished_ms": fin,
                "progress": None,
                "duration_s": (fin - last) / 1000.0 if fin and last else None,
            }
        )
    return out


def render_summary(render: dict, views: list[dict], now_ms: int, eta_s: float | None = None) -> dict:
    """List-row fields: progress, ETA (`eta_s`: the farm's one ETA, coordinator/views/eta.py farm_etas), age,
    submitter, stage."""
    spec = render.get("spec") if isinstance(render.get("spec"), dict) else {}
    frac = 1.0 if render.get("state") == "done" else eta.fraction(views)
    eta_s = None if render.get("state") in TERMINAL else eta_s  # ended within the ETA's second: none
    current = next((v["stage"] for v in views if v["display"] not in ("done", "cancelled")), "")
    if render.get("state") == "assembling":
        current = "mux"
    failed = [v for v in views if v["display"] in ("failed", "retried") and v["error"]]
    return {
        **{k: v for k, v in render.items() if k != "spec"},
        "spec": spec,
        "submitter": spec.get("submitter") or "",
        "prompt": spec.get("prompt") or "",
        "priority": int(render.get("priority") or 0),
        "progress": round(frac, 4),
        "eta_s": eta_s,
        "eta_ms": now_ms + round(eta_s * 1000) if eta_s is not None else None,  # farm watch counts down to it
        "age_s": (now_ms - int(render.get("created_ms") or now_ms)) / 1000.0,
        "current_stage": current,
        "current_stage_label": STAGE_LABELS.get(current, current),
        "failures": [
            {"task": v["id"], "worker": v["worker"], "error": v["error"], "attempts": v["attempts"]}
            for v in failed
        ],
    }


def summarize(store: MetricsStore, render: dict, views: list[dict]) -> dict:
    """One render's row with the farm's ETA (what GetRender and the detail show)."""
    now = redis_now_ms(store)
    etas = eta.farm_etas(store, now, {render["id"]: (render, views)}, task_view)
    return render_summary(render, views, now, etas.get(render["id"]))


def decode_fact(spec: dict, views: list[dict]) -> str:
    """How the clip was (or will be) decoded, from its planned tasks: tile sizes that fit the whole clip
    in one tile plan a single decode, so the sizes alone would say tiles where there are none."""
    tiles = sum(v["kind"] == TaskKind.DECODE_TILE for v in views)
    asked = spec.get("decode_tiles") or "off"
    if tiles:
        return f"{asked} ({tiles} tiles)"
    return "off" if asked == "off" else f"whole clip in one task ({asked} covers it)"


def render_facts(render: dict, views: list[dict]) -> list[tuple[str, str]]:
    """What the detail page states about a render: seed, pack, size, tiling, output."""
    spec = render.get("spec") if isinstance(render.get("spec"), dict) else {}
    size = f"{spec.get('width')}×{spec.get('height')}" + (f", {spec['frames']} frames" if spec.get("frames") else "")
    rows = [("seed", spec.get("seed")), ("pack", spec.get("pack")), ("size", size if spec.get("width") else None),
            ("stage 2 tiles", spec.get("stage2_tiles") or "off"), ("decode tiles", decode_fact(spec, views)),
            ("text encoder", spec.get("text_encoder")), ("output", render.get("output") or "not yet")]
    return [(k, str(v)) for k, v in rows if v not in (None, "")]


def render_detail(store: MetricsStore, render_id: str) -> dict | None:
    """Everything the render page needs: summary, tasks, stage timeline, tile grids, a chunked render's windows."""
    render = store.get_render(render_id)
    if render is None:
        return None
    tasks = store.render_tasks(render_id)
    sizes = blob_sizes(store, {s for t in tasks for f in ("inputs", "outputs") for s in shas_in(t.get(f))})
    views = [task_view(t, sizes) for t in tasks]
    return {
        "render": summarize(store, render, views),
        "tasks": views,
        "stages": stage_summaries(render, views),
        "grids": tile_grids(views),
        "facts": render_facts(render, views),
        "windows": window_rows(render, views),  # a chunked render's windows (views/windows.py), else []
    }


def list_summaries(store: MetricsStore, limit: int = 50) -> list[dict]:
    now = redis_now_ms(store)
    rows = {r["id"]: (r, [task_view(t) for t in store.render_tasks(r["id"])]) for r in store.list_renders(limit)}
    etas = eta.farm_etas(store, now, rows, task_view)
    return [render_summary(r, vs, now, etas.get(rid)) for rid, (r, vs) in rows.items()]
