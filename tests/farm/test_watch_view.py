"""`farm watch`'s rich view replayed on the events of a real tiled render (real Redis), off a pty."""

from __future__ import annotations

import io

from rich.console import Console

from coordinator.state.store import FarmStore
from coordinator.views import metrics
from farm_cli.watch_view import WatchState, watch_render
from tests.farm.test_dashboard import new_render, run_to_the_end


def snapshot(store: FarmStore, rid: str) -> dict:
    """What FarmClient.get returns: the render record with its tasks."""
    return {**store.get_render(rid), "tasks": store.render_tasks(rid)}


def recorded_render(store: FarmStore) -> tuple[str, dict, list[dict], dict]:
    rid = new_render(store)
    first = snapshot(store, rid)
    run_to_the_end(store, rid, fail_once="s2.step1.tile2")
    events = [e for _, e in store.read_events(rid, "0", count=100_000)]
    return rid, first, events, snapshot(store, rid)


def test_events_fold_to_the_store_state(store: FarmStore) -> None:
    rid, first, events, final = recorded_render(store)
    state = WatchState(first)
    for event in events:
        assert not state.apply(event)
    got = {v["id"]: (v["display"], v["worker"]) for v in state.views()}
    want = {v["id"]: (v["display"], v["worker"]) for v in (metrics.task_view(t) for t in final["tasks"])}
    assert got == want and state.render["state"] == "done"


def test_watch_view_final_screen(store: FarmStore) -> None:
    rid, first, events, final = recorded_render(store)
    calls = []

    def get_render() -> dict:
        calls.append(1)
        return first if len(calls) == 1 else final

    console = Console(record=True, force_terminal=True, width=100, file=io.StringIO())
    result = watch_render(iter(events), get_render, console=console, min_interval_s=0.0)
    assert result["state"] == "done" and len(calls) == 2
    text = console.export_text()
    screen = text[text.rindex(f"render {rid}") :]
    assert "running" in text[: text.rindex(f"render {rid}")]  # earlier frames showed work in progress
    for label in ("Text", "Stage 1", "Upsample", "Stage 2", "Decode", "Audio", "Mux"):
        line = next(line for line in screen.splitlines() if line.startswith(label))
        assert " done" in line, line
    assert "Decode  2/2 done" in screen and "█" * 20 in screen  # the last tiled step's grid, all done
    assert "studio-1" in screen and "100%" in screen
    assert "tile2 on studio-2 (attempt 1): Metal: insufficient memory" in text  # shown while it waited
