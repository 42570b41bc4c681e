"""Words and times people read about a render: a task's human name and the ETA from measured speeds.

Pure functions over task views (coordinator.views.metrics.task_view); the measured speeds are the farm's
per-kind lease-to-done means (`{p}:kindtime:{kind}`, written by complete.lua), read by metrics.
"""

from __future__ import annotations

from collections.abc import Mapping

from protos.kinds import TaskKind, facts

_ENDED = ("done", "cancelled")


# Stage order of the pipeline, as shown on the timeline; "mux" is the coordinator's assembly.
STAGES: tuple[tuple[str, str], ...] = (
    ("text", "Text"),
    ("length", "Length"),  # an LTX-2.5 render's DurationHead picking its length (plan_length)
    ("image", "Image"),
    ("source", "Source"),  # a source clip's tiled encode (`source_encode`)
    ("stage1", "Stage 1"),
    ("upsample", "Upsample"),
    ("stage2", "Stage 2"),
    ("dfr", "DFR"),
    ("decode", "Decode"),
    ("audio", "Audio"),
    ("mux", "Mux"),
)


def task_label(kind: str, step: object = None, tile_index: object = None, round_: object = None) -> str:
    """A task's name for people: 'tile 3', 'blend tiles + sampler step 2', 'video decode'."""
    label = facts(kind).label or kind.replace("_", " ") or "task"  # the dashboard's words (protos/kinds.py)
    if isinstance(tile_index, int):
        label += f" {tile_index + 1}"
    if kind == TaskKind.TDP_STEP and isinstance(step, int):
        label += f" {step + 1}"
    if isinstance(round_, int) and kind.startswith("dfr"):
        label += f" (round {round_})"
    return label


def _stage_seconds(tasks: list[dict], speeds: Mapping[str, float], workers: int, now_ms: int) -> float | None:
    """A stage's time left: its tasks share the workers, but no faster than its longest task left."""
    left = []
    for t in tasks:
        mean = speeds.get(t["kind"])
        if mean is None:
            return None
        ran = (now_ms - t["leased_ms"]) / 1000.0 if t["display"] in ("leased", "running") and t["leased_ms"] else 0.0
        left.append(max(0.0, mean - ran))
    return max(max(left), sum(left) / max(1, workers))


def eta_from_speeds(views: list[dict], stage_order: list[str], speeds: Mapping[str, float], workers: int,
                    now_ms: int) -> float | None:
    """Seconds until the render's tasks are done: stages one after another, each from the measured mean
    time of its task kinds spread over the live workers. None when a kind left has no measurement yet."""
    by_stage: dict[str, list[dict]] = {}
    for v in views:
        if v["display"] not in _ENDED:
            by_stage.setdefault(v["stage"], []).append(v)
    total = 0.0
    for stage in sorted(by_stage, key=lambda s: stage_order.index(s) if s in stage_order else len(stage_order)):
        seconds = _stage_seconds(by_stage[stage], speeds, workers, now_ms)
        if seconds is None:
            return None
        total += seconds
    return total
