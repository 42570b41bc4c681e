"""A chunked render's windows as one row: each window waiting, rendering or done, and the frames of the
joined clip it covers. Pure: the dashboard, `farm watch` and the growing film (`coordinator/assemble/growing.py`)
read the same answer from the render's tasks.

A window is done once its decode is (every `w{k}.decode…` task): its frames exist, and the film can take
its share of them. It is rendering once any of its tasks was leased (or is done), else waiting.
"""

from __future__ import annotations

from coordinator.plan.chunks import chunk_layout, chunked
from coordinator.plan.decode import DECODE
from coordinator.plan.resolved import RenderPlan
from protos.states import TaskState

WAITING, RENDERING, DONE = "waiting", "rendering", "done"


def _name(render_id: str, task: dict) -> str:
    return str(task.get("id", "")).removeprefix(f"{render_id}.")


def _window_state(names_states: list[tuple[str, str]], index: int) -> str:
    prefix = f"w{index}."
    mine = [(name, state) for name, state in names_states if name.startswith(prefix)]
    decode = [state for name, state in mine if name.removeprefix(prefix).split(".")[0] == DECODE]
    if decode and all(state == TaskState.DONE for state in decode):
        return DONE
    if any(state in (TaskState.LEASED, TaskState.DONE) for _, state in mine):
        return RENDERING
    return WAITING


def window_rows(render: dict, tasks: list[dict]) -> list[dict]:
    """One row per window of a chunked render ({index, state, frames: [start, stop)}); [] for any other.
    `tasks`: the store's task records or their views (each with id and state)."""
    spec = render.get("spec") if isinstance(render.get("spec"), dict) else {}
    if not spec.get("chunked") or not spec.get("frames"):
        return []
    plan = RenderPlan.from_stored(spec)
    if not chunked(plan):
        return []
    names_states = [(_name(str(render.get("id", "")), t), str(t.get("state", ""))) for t in tasks]
    return [{"index": w.index, "state": _window_state(names_states, w.index), "frames": [w.start, w.stop]}
            for w in chunk_layout(plan).windows]


def decoded_windows(rows: list[dict]) -> int:
    """How many windows, from the first, are done: the windows the growing film may hold."""
    count = 0
    for row in rows:
        if row["state"] != DONE:
            break
        count += 1
    return count


def windows_line(rows: list[dict]) -> str:
    """The row in words, for `farm watch`: `windows  0 done 0–17 · 1 rendering 8–25 · 2 waiting 16–33`."""
    return "windows  " + " · ".join(f"{r['index']} {r['state']} {r['frames'][0]}–{r['frames'][1]}" for r in rows)
