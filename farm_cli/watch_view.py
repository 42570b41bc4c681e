"""`farm watch` as a live terminal view: a bar per stage, the current tiled step's grid, workers, ETA.

The view keeps a local copy of the render (one get_render() call up front) and applies each event
to it, so following a render costs one RPC plus the event stream; it re-reads the render only when
the event stream names tasks it does not know (tiles added per step) and once at the end. The
numbers (stages, tile boxes, ETA) come from coordinator.views.metrics, the same code as the dashboard.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from coordinator.views import metrics
from coordinator.views.windows import window_rows, windows_line
from farm_cli.views import length_note
from protos.states import TERMINAL

GLYPHS = {
    "done": ("█", "green"),
    "running": ("▓", "blue"),
    "leased": ("▒", "yellow"),
    "queued": ("░", "grey50"),
    "retried": ("╳", "dark_orange"),
    "failed": ("✗", "bold red"),
    "waiting": ("·", "grey35"),
    "cancelled": (" ", "grey35"),
}
STATE_STYLE = {
    "done": "green",
    "running": "blue",
    "failed": "bold red",
    "queued": "grey50",
    "cancelled": "grey50",
}
GRID_COLS = 32
ETA_REFRESH_MS = 2000  # a task's end re-reads the render (its ETA) at most this often
_ENDS = ("task_done", "task_failed", "task_retry", "task_expired", "task_lost")


class WatchState:
    """The render as last seen plus every event applied since; task dicts shaped like the store's."""

    def __init__(self, render: dict) -> None:
        self.now_ms = int(time.time() * 1000)
        self.reset(render)

    def reset(self, render: dict) -> None:
        self.render = {k: v for k, v in render.items() if k != "tasks"}
        self.tasks = {str(t["id"]): dict(t) for t in render.get("tasks") or []}
        if render.get("eta_ms") is not None and render.get("eta_s") is not None:  # the coordinator's clock
            self.now_ms = int(render["eta_ms"] - float(render["eta_s"]) * 1000)
        self.read_ms = self.now_ms

    def eta_s(self) -> float | None:
        """The coordinator's ETA (coordinator/views/eta.py, the one every view shows), counted down since it was read."""
        eta_ms = self.render.get("eta_ms")
        return None if eta_ms is None or self.render.get("state") in TERMINAL else max(0.0, (eta_ms - self.now_ms) / 1000)

    def apply(self, event: dict) -> bool:
        """Fold one event in; True when the render must be re-read: a task we have never seen, or a task
        ended and the coordinator's ETA is older than ETA_REFRESH_MS."""
        etype = str(event.get("type", ""))
        self.now_ms = int(event.get("ts") or self.now_ms)
        if etype == "tasks_added":
            return True
        if etype.startswith("render"):
            state = {"render_failed": "failed", "render_cancelled": "cancelled"}.get(etype, event.get("state"))
            self.render.update({k: event[k] for k in ("stage", "error") if event.get(k)})
            self.render["state"] = state or self.render.get("state")
            if self.render["state"] in TERMINAL:
                self.render["finished_ms"] = self.render.get("finished_ms") or self.now_ms
            if etype == "render_state" and event.get("state") == "running":
                self.render["started_ms"] = self.render.get("started_ms") or self.now_ms
            return False
        task = self.tasks.get(str(event.get("task", "")))
        if task is None:
            return bool(event.get("task"))
        _fold_task_event(task, etype, event, self.now_ms)
        return etype in _ENDS and self.now_ms - self.read_ms >= ETA_REFRESH_MS

    def views(self) -> list[dict]:
        return [metrics.task_view(t) for t in self.tasks.values()]


def _fold_task_event(task: dict, etype: str, event: dict, now_ms: int) -> None:
    if etype == "task_queued":
        task.update(state="queued", queued_ms=now_ms)
    elif etype == "task_leased":
        task.update(
            state="leased",
            worker=event.get("worker", ""),
            attempts=event.get("attempt", 1),
            leased_ms=event.get("leased_ms") or now_ms,
            progress={},
            ranks=[],
        )
    elif etype == "gang_started":
        task["ranks"] = list(event.get("members") or [])
    elif etype == "task_progress":
        task["progress"] = event.get("progress") or {}
    elif etype == "task_done":
        task.update(
            state="done",
            worker=event.get("worker", task.get("worker")),
            done_ms=now_ms,
            metrics=event.get("metrics") or {},
            error="",
            ranks=list(event.get("workers") or task.get("ranks") or []),
        )
    elif etype in ("task_retry", "task_expired"):
        task.update(state="queued", error=event.get("error") or f"lease expired on {event.get('worker')}")
    elif etype == "task_failed":
        task.update(state="failed", error=event.get("error", ""), done_ms=now_ms)


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = max(0.0, seconds)
    return f"{seconds:.1f}s" if seconds < 60 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _stage_table(stages: list[dict], views: list[dict]) -> Table:
    table = Table.grid(padding=(0, 1))
    for _ in range(5):
        table.add_column()
    for s in stages:
        workers = sorted({w for v in views if v["stage"] == s["name"] for w in v["workers"]})
        prog = s.get("progress") or {}
        extra = f" step {prog['step']}/{prog['total']}" if prog.get("total") else ""
        table.add_row(
            Text(f"{s['label']:<9}"),
            ProgressBar(
                total=max(1, s["total"]),
                completed=s["done"],
                width=30,
                complete_style=STATE_STYLE.get(s["state"], "blue"),
            ),
            Text(f"{s['done']:>3}/{s['total']:<3}"),
            Text(f"{s['state']}{extra}", style=STATE_STYLE.get(s["state"], "")),
            Text(f"{_dur(s['duration_s'])}  {', '.join(workers)}", style="grey62"),
        )
    return table


def current_grid(grids: list[dict]) -> dict | None:
    """The tiled step being worked on: the first tiled grid not all done, else the last one."""
    tiled = [g for g in grids if g["tiled"]]
    return next((g for g in tiled if g["done"] < g["total"]), tiled[-1] if tiled else None)


def grid_text(grid: dict) -> Text:
    """The grid in characters, to scale: one block per temporal row, a glyph per tile state."""
    cols = GRID_COLS
    lines = max(2, round(cols * (grid.get("aspect") or 0.5625) / 2))
    out = Text(f"{grid['label']}  {grid['done']}/{grid['total']} done\n", style="bold")
    for row in grid["rows"]:
        if row.get("frames"):
            out.append(f"frames {row['frames'][0]}–{row['frames'][1]}\n", style="grey62")
        for r in range(lines):
            y = (r + 0.5) / lines
            for c in range(cols):
                x = (c + 0.5) / cols
                tile = next(
                    (
                        t
                        for t in row["tiles"]
                        if t["box"][0] <= x < t["box"][1] and t["box"][2] <= y < t["box"][3]
                    ),
                    None,
                )
                glyph, style = GLYPHS.get(tile["display"] if tile else "waiting", ("?", ""))
                out.append(glyph, style=style)
            out.append("\n")
    legend = [
        f"{t['tile_index'] if t['tile_index'] is not None else t['name']}:{t['worker'] or '–'}"
        for row in grid["rows"]
        for t in row["tiles"]
    ]
    out.append("tiles " + "  ".join(legend), style="grey62")
    return out


def render_view(state: WatchState) -> Group:
    """The whole screen for the current state."""
    views = state.views()
    summary = metrics.render_summary(state.render, views, state.now_ms, state.eta_s())
    stages = metrics.stage_summaries(state.render, views)
    head = Text(f"render {summary['id']}  ", style="bold")
    head.append(str(summary.get("state")), style=STATE_STYLE.get(str(summary.get("state")), "blue"))
    head.append(
        f"  {summary['progress'] * 100:.0f}%  ETA {_dur(summary['eta_s'])}  stage "
        f"{summary['current_stage_label'] or '–'}"
    )
    parts: list = [head, _stage_table(stages, views)]
    note = length_note(state.render.get("spec") if isinstance(state.render.get("spec"), dict) else {})
    if note:
        parts.insert(1, Text(note, style="grey62"))
    rows = window_rows(state.render, list(state.tasks.values()))
    if rows:  # a chunked render's windows, a row of their own
        parts.append(Text(windows_line(rows)))
    grid = current_grid(metrics.tile_grids(views))
    if grid is not None:
        parts.append(grid_text(grid))
    for f in summary["failures"]:
        parts.append(
            Text(
                f"✗ {f['task'].rsplit('.', 1)[-1]} on {f['worker'] or '?'} (attempt {f['attempts']}): "
                f"{f['error']}",
                style="red",
            )
        )
    if summary.get("error"):
        parts.append(Text(f"error: {summary['error']}", style="bold red"))
    return Group(*parts)


def watch_render(
    events: Iterable[dict],
    get_render: Callable[[], dict],
    console: Console | None = None,
    min_interval_s: float = 0.1,
) -> dict:
    """Show the render live while `events` lasts (FarmClient.watch ends at the render's end).

    get_render() returns the render record with its "tasks" (FarmClient.get). Returns the final record.
    """
    state = WatchState(get_render())
    last_draw = 0.0
    with Live(render_view(state), console=console, refresh_per_second=8, transient=False) as live:
        for event in events:
            if state.apply(event):
                state.reset(get_render())
            if time.monotonic() - last_draw >= min_interval_s:
                live.update(render_view(state), refresh=True)
                last_draw = time.monotonic()
        final = get_render()
        state.reset(final)
        live.update(render_view(state), refresh=True)
    return final
