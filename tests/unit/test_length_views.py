"""How a DurationHead's length reads in the terminal: the `submit --wait` line, `farm status ID`, and
the live `farm watch` view, before the length is picked and after."""

from __future__ import annotations

from rich.console import Console

from farm_cli.remote import progress_printer
from farm_cli.views import render_details
from farm_cli.watch_view import WatchState, render_view

PENDING = {"prompt": "a fox", "height": 64, "width": 64, "frames": None, "frame_rate": 24.0, "generation": "2.5",
           "predicted_seconds": None, "pack": "tiny25"}
PICKED = {**PENDING, "frames": 49, "predicted_seconds": 2.2512}
LINE = "duration head: 2.25 s predicted -> 49 frames at 24 fps"


def _screen(spec: dict) -> str:
    console = Console(width=120, record=True)
    console.print(render_view(WatchState({"id": "r1", "state": "running", "spec": spec, "tasks": []})))
    return console.export_text()


def test_the_picked_length_is_one_line_everywhere(capsys) -> None:
    progress_printer()({"type": "length_chosen", "frames": 49, "seconds": 2.2512, "frame_rate": 24.0})
    assert capsys.readouterr().err.strip() == LINE
    assert f"  length     {LINE}" in render_details({"id": "r1", "state": "running", "spec": PICKED})
    assert LINE in _screen(PICKED)


def test_a_length_being_picked_says_so_and_a_given_one_says_nothing() -> None:
    assert "picking the length" in _screen(PENDING)
    assert any("picking the length" in line for line in render_details({"id": "r1", "state": "queued", "spec": PENDING}))
    given = {**PENDING, "frames": 25}
    assert "duration head" not in _screen(given)
    assert not any("length " in line for line in render_details({"id": "r1", "state": "queued", "spec": given}))


def test_farm_plan_says_a_25_plan_without_frames_is_its_first_phase(capsys) -> None:
    from coordinator.plan import placement
    from coordinator.views.forecast import forecast
    from farm_cli.plan import print_plan

    caps = [{"packs": ["p"], "pack_generation": {"p": "2.5"}, "memory_bytes": 2**40}]
    plan = forecast({"prompt": "a fox", "pack": "p"}, caps, [placement.Slot("w1", "", 2**40, {})])
    print_plan(plan)
    out = capsys.readouterr().out
    assert "picked by the pack's DurationHead" in out and "384x256x? on 1 worker" in out and "None" not in out
