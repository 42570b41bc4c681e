"""Draining a worker: it finishes the task it runs, is given no other, and exits 0; `farm workers` and
the dashboard show it draining, then drained. Real Redis, coordinator, worker processes, tiny pack."""

from __future__ import annotations

import os

import pytest

from coordinator.views import fleet
from tests.farm.farm_harness import farm, wait_done

SPEC = {"prompt": "a fox", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 3, "pack": "tiny"}
TASK = {"id": "r1.a", "kind": "k", "capability": "mlx"}


def test_a_draining_worker_gets_no_task_and_a_fresh_start_clears_the_mark(store):
    store.register_worker("w1", {})
    store.create_render("r1", {}, [dict(TASK)])
    assert store.drain_worker("w1") and not store.drain_worker("nobody")
    assert store.lease("w1", ["mlx"], 1000) is None
    store.register_worker("w1", {}, resumed=True)  # the same agent back after an outage: still draining
    assert store.worker_draining("w1") and store.lease("w1", ["mlx"], 1000) is None
    store.register_worker("w1", {})  # a new process: serves again
    assert not store.worker_draining("w1") and store.lease("w1", ["mlx"], 1000)["id"] == "r1.a"


def test_worker_state_is_one_reading_for_cli_and_dashboard():
    now = 1_000_000
    seen = {"last_seen_ms": now - 1000}
    assert fleet.worker_state({**seen, "state": "busy"}, now) == "busy"
    assert fleet.worker_state({**seen, "state": "busy", "drain": "1"}, now) == "draining"
    assert fleet.worker_state({**seen, "state": "drained", "drain": "1"}, now) == "drained"
    assert fleet.worker_state({**seen, "state": "lost"}, now) == "lost"
    assert fleet.worker_state({"last_seen_ms": now - fleet.LOST_AFTER_MS - 1, "state": "idle"}, now) == "lost"
    assert fleet.worker_view({"id": "w", **seen, "blocklisted": "r1 r2"}, now)["blocklisted_for"] == ["r1", "r2"]


@pytest.mark.timeout(420)
def test_drained_worker_finishes_its_task_takes_no_more_and_exits(store, tmp_data, tiny_packs):
    with farm(store, tmp_data, tiny_packs, workers=2) as (client, procs):
        render_id = client.submit(dict(SPEC))
        stage1 = None
        for event in client.watch(render_id):
            if event.get("type") == "task_leased" and str(event.get("task")).endswith(".stage1"):
                stage1 = event
                break
        drained = stage1["worker"]
        assert client.drain(drained)
        drain_ms = int(store.client.time()[0]) * 1000
        rows = {w["id"]: w for w in client.workers()}
        assert rows[drained]["state"] in ("draining", "drained")
        assert procs[drained].wait(timeout=120) == 0  # it exits by itself once its task is done
        render = wait_done(client, render_id)
        events = list(client.watch(render_id))
        cli_rows = {w["id"]: w["state"] for w in client.workers()}
        dash_rows = {w["id"]: w["state"] for w in fleet.list_workers(store)}
    task = next(t for t in render["tasks"] if t["id"] == stage1["task"])
    assert task["worker"] == drained and int(task["attempts"]) == 1  # finished where it ran
    late = [e for e in events if e.get("type") == "task_leased" and e.get("worker") == drained
            and int(e.get("ts") or 0) > drain_ms + 1000]
    assert late == [], late
    assert cli_rows == dash_rows and cli_rows[drained] == "drained"


@pytest.mark.timeout(60)
def test_drain_from_the_cli_names_the_worker_or_says_it_is_unknown(store, tmp_data):
    """`farm drain WORKER` and `farm worker --drain --worker-id ID` over real gRPC to a real coordinator."""
    import subprocess
    import sys

    from coordinator.server import serve, stop
    from tests.farm.farm_harness import ROOT, join_token

    cli = [sys.executable, "-c", "from farm_cli.main import main; main()"]
    server, port = serve(store, tmp_data, token="t" * 16)
    token = join_token(tmp_data, "t" * 16)
    try:
        store.register_worker("mac-1", {})
        address = f"127.0.0.1:{port}"
        run = lambda *args: subprocess.run([*cli, *args, "--coordinator", address],  # noqa: E731
                                           capture_output=True, text=True, cwd=ROOT, timeout=30,
                                           env={**os.environ, "FARM_TOKEN": token})
        drained = run("drain", "mac-1")
        assert drained.returncode == 0 and "mac-1 draining" in drained.stdout, drained.stderr
        unknown = run("worker", "--drain", "--worker-id", "mac-2")
        assert unknown.returncode == 1 and "mac-2 is not a registered worker" in unknown.stdout, unknown.stderr
    finally:
        stop(server)
    assert store.worker_draining("mac-1") and fleet.list_workers(store)[0]["state"] == "draining"
