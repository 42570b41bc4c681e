"""One ETA (item 5): `farm ls`, `farm status ID`, `farm watch` and the dashboard's list and
detail show the same number for the same render, through the real CLI and coordinator.

The farm: a real worker renders once (the cost model learns its speeds), then stops; its registration is
made again as it stood, so the fleet is live but takes nothing, and two renders queued behind each
other hold still while every view is read. The second waits behind the first: its ETA is larger, in
every view (the list once ran each row behind the rows above it, the detail each render alone).
The real render also leaves its schedule: an attempt row per task, with worker, times and outcome."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from coordinator.api.auth import load_or_create_token
from coordinator.dashboard import start_dashboard, stop_dashboard
from farm_cli.views import duration
from farm_cli.watch_view import WatchState, render_view
from tests.farm.farm_harness import ROOT, farm, wait_done

SPEC = {"height": 256, "width": 384, "frames": 25, "seed": 3, "pack": "tiny"}


def cli(tmp_data, address: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", "from farm_cli.main import main; main()", *args, "--coordinator", address],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "FARM_TOKEN": load_or_create_token(tmp_data),
             "FARM_DATA": str(tmp_data / "cli")})
    assert result.returncode == 0, result.stderr
    return result.stdout


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


@pytest.mark.timeout(300)
def test_one_eta_in_every_view(store, tmp_data, tiny_packs) -> None:
    with farm(store, tmp_data, tiny_packs, workers=1) as (client, procs):
        warm = wait_done(client, client.submit({**SPEC, "prompt": "warm up"}))
        attempts = store.render_attempts(warm["id"])  # the schedule's rows, written by the real run's scripts
        assert sorted(a["task"] for a in attempts) == sorted(t["id"] for t in warm["tasks"])
        assert {a["outcome"] for a in attempts} == {"done"} and {a["worker"] for a in attempts} >= {"w1"}
        assert all(a["start_ms"] <= a["end_ms"] for a in attempts)
        info = store.list_workers()[0]["info"]
        procs["w1"].terminate()
        procs["w1"].wait(timeout=30)
        store.register_worker("w1", info)  # live again, as it registered, but nobody leases now
        address = client.address
        first = cli(tmp_data, address, "submit", "-p", "a fox in the snow", "--seed", "1").split()[-1]
        second = cli(tmp_data, address, "submit", "-p", "a heron at dusk", "--seed", "2").split()[-1]
        listed = {r["id"]: r["eta_s"] for r in json.loads(cli(tmp_data, address, "ls", "--json"))}
        status = {rid: json.loads(cli(tmp_data, address, "status", rid, "--json"))["eta_s"] for rid in (first, second)}
        table = cli(tmp_data, address, "ls", "--columns", "id,eta")
        details = cli(tmp_data, address, "status", second)
        watched = render_view(WatchState(client.get(second)))
        server, port = start_dashboard(store, "127.0.0.1", 0)
        try:
            url = f"http://127.0.0.1:{port}/api/renders"
            dash_list = {r["id"]: r["eta_s"] for r in get_json(url)["renders"]}
            dash_detail = {rid: get_json(f"{url}/{rid}")["render"]["eta_s"] for rid in (first, second)}
        finally:
            stop_dashboard(server)
    for rid in (first, second):
        assert listed[rid] is not None and listed[rid] > 0
        assert listed[rid] == status[rid] == dash_list[rid] == dash_detail[rid], (rid, listed, status, dash_list,
                                                                                   dash_detail)
    assert listed[second] > listed[first]  # queued behind the first, whoever asks
    shown = duration(listed[second])
    assert f"{second} {shown}" in " ".join(table.split()) and f"eta        {shown}" in details
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(watched)
    assert f"ETA {listed[second]:.1f}s" in console.export_text()
