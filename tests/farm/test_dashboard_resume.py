"""The dashboard's resume button beside drain: through the API (token and CSRF checked) on the store,
and on a real worker process that had already begun draining: resumed, it serves on and, as the only
worker, finishes the render it would otherwise have left."""

from __future__ import annotations

import subprocess
import time

import pytest

from coordinator.dashboard import start_dashboard, stop_dashboard
from farm_cli.services import worker_command
from tests.farm.farm_harness import ROOT, token_file, wait_done
from tests.farm.test_dashboard import post

SPEC = {"prompt": "a fox", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 3, "pack": "tiny"}
CSRF = "c" * 32


def _act(port: int, worker: str, what: str, token: str = "sekrit", csrf: str = CSRF) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}", "Cookie": f"farm_csrf={CSRF}", "X-CSRF-Token": csrf}
    return post(f"http://127.0.0.1:{port}/api/workers/{worker}/{what}", headers)


def test_resume_lifts_a_drain_only_while_the_worker_is_there(store, tmp_data) -> None:
    store.register_worker("w1", {})
    store.create_render("r1", {}, [{"id": "r1.a", "kind": "k", "capability": "mlx"}])
    server, port = start_dashboard(store, port=0, token="sekrit", data_dir=tmp_data)
    try:
        assert _act(port, "w1", "resume") == (200, {"worker": "w1", "resumed": False})  # not draining
        assert _act(port, "w1", "drain") == (200, {"worker": "w1", "draining": True})
        assert _act(port, "w1", "resume", csrf="x" * 32)[0] == 403 and store.worker_draining("w1")
        assert _act(port, "w1", "resume", token="wrong")[0] == 403 and store.worker_draining("w1")
        assert _act(port, "w1", "resume") == (200, {"worker": "w1", "resumed": True})
        assert not store.worker_draining("w1") and store.lease("w1", ["mlx"], 1000)["id"] == "r1.a"
        assert _act(port, "nobody", "resume")[1]["resumed"] is False
        store.drain_worker("w1")
        store.worker_seen("w1", "drained", "")  # it exited: nothing left to resume
        assert _act(port, "w1", "resume")[1]["resumed"] is False and store.worker_draining("w1")
    finally:
        stop_dashboard(server)


def _wait_log(path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} never in {path}:\n{path.read_text(errors='replace')[-3000:]}")


@pytest.mark.timeout(400)
def test_a_draining_worker_resumed_from_the_dashboard_serves_on(store, tmp_data, tiny_packs) -> None:
    from coordinator.api.auth import load_or_create_token
    from coordinator.server import serve, stop
    from farm_cli.client import FarmClient

    token = load_or_create_token(tmp_data)
    server, port = serve(store, tmp_data, "127.0.0.1", 0, token, lease_ms=1500, expiry_interval_s=0.2)
    address, log = f"127.0.0.1:{port}", tmp_data / "slow.log"
    cmd = worker_command(address, token_file(tmp_data, "slow", token), tiny_packs, "slow", tmp_data / "cache-slow",
                         wait_ms=500) + ["--throttle", "5"]  # each task 5x its compute: time to drain and resume
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    dash, dport = start_dashboard(store, port=0, token=token, data_dir=tmp_data)
    client = FarmClient(address, token, timeout=30)
    try:
        render_id = client.submit(dict(SPEC))
        deadline = time.monotonic() + 120
        while not str(store.client.hget(store.key("worker", "slow"), "current_task") or "").endswith(".stage1"):
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
        assert _act(dport, "slow", "drain", token=token)[1]["draining"] is True
        _wait_log(log, "draining: finishing the current task", 30)  # the worker heard it mid-task
        assert _act(dport, "slow", "resume", token=token)[1]["resumed"] is True
        _wait_log(log, "resumed: the coordinator lifted the drain", 30)
        render = wait_done(client, render_id)  # the only worker: it finished only because it stayed
        assert proc.poll() is None and "drained: exiting" not in log.read_text(errors="replace")
        assert {t["worker"] for t in render["tasks"] if t.get("capability") != "coordinator"} == {"slow"}
    finally:
        client.close()
        stop_dashboard(dash)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        stop(server)
