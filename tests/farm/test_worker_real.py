"""Real worker subprocesses (`python -m worker.agent`: the real Runner, MLX on the tiny pack) against the
gRPC coordinator: a cancel mid-render, a coordinator that comes up after its worker, and SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from coordinator.api.auth import load_or_create_token
from coordinator.server import serve, stop
from coordinator.state.redis_server import free_port
from farm_cli.client import FarmClient
from tests.farm.farm_harness import farm, start_worker, wait_done

SPEC = {
    "prompt": "a fox",
    "height": 256,
    "width": 384,
    "frames": 25,
    "frame_rate": 24.0,
    "seed": 3,
    "pack": "tiny",
}


def _wait(
    predicate: Callable[[], object], timeout: float, what: str, detail: Callable[[], str] = str
) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{detail()}")


def _log(data: Path, name: str) -> str:
    path = data / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _handlers_at_work() -> str:
    """Where this process's RPC handlers stand: what a registration that never lands was waiting on."""
    frames = sys._current_frames()
    lines = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if frame is None or not thread.name.startswith("farm-rpc"):
            continue
        stack = traceback.extract_stack(frame)
        if stack[-1].filename.endswith("thread.py") and stack[-1].name == "_worker":
            continue  # idle: waiting on its pool's queue
        lines.append(f"{thread.name}: " + " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                                                      for f in reversed(stack[-6:])))
    return "\n".join(lines) or "no RPC handler at work in the coordinator"


def _first_lease(client: FarmClient, render_id: str, suffixes: tuple[str, ...]) -> dict:
    """The first task_leased event of a task whose id ends in one of suffixes (the watch is left early)."""
    for event in client.watch(render_id, timeout=120):
        if event.get("type") == "task_leased" and str(event.get("task", "")).endswith(suffixes):
            return event
    raise AssertionError(f"render {render_id} ended before a {suffixes} task was leased")


@pytest.mark.timeout(300)
def test_cancel_mid_render_then_the_same_worker_renders_again(store, tmp_data, tiny_packs) -> None:
    # lease 3 s -> a heartbeat every 1 s: the worker hears the cancel during the text encode (~3 s cold).
    with farm(store, tmp_data, tiny_packs, workers=1, lease_ms=3000) as (client, procs):
        worker = procs["w1"]
        first = client.submit(dict(SPEC))
        leased = _first_lease(client, first, (".text", ".stage1"))
        assert client.cancel(first) is True
        task_id = leased["task"]
        events = [e["type"] for e in client.watch(first, timeout=60)]
        assert events[-1] == "render_cancelled", events
        assert client.get(first)["state"] == "cancelled"
        # The worker hears CANCEL on its next heartbeat, stops and reports the task with Fail, which the
        # coordinator answers STALE (the render is over). Only if the task outran the heartbeat does its
        # Complete get the same STALE refusal instead; either way nothing of it is committed.
        reported = (f"task {task_id} reported failed (cancelled, transient): STALE", f"task {task_id}: STALE")
        _wait(
            lambda: any(line in _log(tmp_data, "w1") for line in reported),
            60,
            f"w1 to report {task_id}",
            lambda: _log(tmp_data, "w1"),
        )
        states = {t["id"]: t["state"] for t in store.render_tasks(first)}
        assert states[task_id] == "cancelled", states
        assert "done" not in states.values(), states
        assert worker.poll() is None, "the worker must survive a cancel"

        second = client.submit(dict(SPEC, seed=4))
        render = wait_done(client, second)
        assert {t["worker"] for t in render["tasks"]} == {"w1"}
        assert all(t["state"] == "done" for t in store.render_tasks(second))
        assert worker.poll() is None, "the same worker process served both renders"


@pytest.mark.timeout(300)
def test_worker_started_before_its_coordinator_registers_and_renders(store, tmp_data, tiny_packs) -> None:
    token = load_or_create_token(tmp_data)
    port = free_port()
    address = f"127.0.0.1:{port}"
    worker = start_worker(address, token, tiny_packs, "w-early", tmp_data)
    server = None
    try:
        _wait(
            lambda: "unreachable" in _log(tmp_data, "w-early") or worker.poll() is not None,
            120,
            "the worker to find no coordinator",
            lambda: _log(tmp_data, "w-early"),
        )
        time.sleep(1.5)
        assert worker.poll() is None, _log(tmp_data, "w-early")
        server, bound = serve(store, tmp_data, "127.0.0.1", port, token)
        assert bound == port
        _wait(
            lambda: any(w["id"] == "w-early" for w in store.list_workers()),
            60,
            "registration",
            lambda: f"{_log(tmp_data, 'w-early')}\n{_handlers_at_work()}",
        )
        with FarmClient(address, token, timeout=30) as client:
            render = wait_done(client, client.submit(dict(SPEC)))
        assert {t["worker"] for t in render["tasks"]} == {"w-early"}
        assert "tiny" in store.list_workers()[0]["info"]["packs"]
    finally:
        if worker.poll() is None:
            worker.terminate()
        try:
            code = worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            code = None
        if server is not None:
            stop(server)
    assert code == 0, _log(tmp_data, "w-early")


@pytest.mark.timeout(300)
def test_sigterm_mid_task_exits_zero_and_hands_the_task_back(store, tmp_data, tiny_packs) -> None:
    with farm(store, tmp_data, tiny_packs, workers=1, lease_ms=3000) as (client, procs):
        worker = procs["w1"]
        render_id = client.submit(dict(SPEC))
        task_id = _first_lease(client, render_id, (".text", ".stage1"))["task"]
        _wait(  # the worker has the lease and is running the task (the text encode takes seconds cold)
            lambda: f"task {task_id} (" in _log(tmp_data, "w1"),
            30,
            f"w1 to start {task_id}",
            lambda: _log(tmp_data, "w1"),
        )
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=90)  # a hang guard with room for a loaded machine, not a figure
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the worker ignored SIGTERM for 90 s\n{_log(tmp_data, 'w1')}") from None
        assert code == 0, _log(tmp_data, "w1")
        task = store.get_task(task_id)
        # The run stops, the task is handed back for another worker (or, if it finished just before the
        # signal, committed): never left leased until its deadline.
        assert task["state"] in ("queued", "done"), task
        if task["state"] == "queued":
            assert "shutting down" in task.get("error", ""), task
            assert f"task {task_id} reported failed (worker shutting down, transient): REQUEUED" in _log(tmp_data, "w1")


@pytest.mark.timeout(300)
def test_status_shows_failure_text_and_worker(store, tmp_data, tiny_packs, tmp_path):
    """A task that fails on a worker shows its error and the worker in `farm status ID`."""
    import shutil
    import sys

    import mlx.core as mx

    from tests.farm.farm_harness import ROOT, farm

    packs = tmp_path / "packs"
    shutil.copytree(tiny_packs / "tiny", packs / "broken")
    weights = packs / "broken" / "vae_decoder.safetensors"
    tensors = dict(mx.load(str(weights)))
    tensors.pop(sorted(tensors)[0])
    mx.save_safetensors(str(weights), tensors)
    with farm(store, tmp_data, packs, workers=1) as (client, _procs):
        render_id = client.submit({"prompt": "a fox", "pack": "broken", "height": 256, "width": 384, "frames": 25})
        deadline = time.monotonic() + 200
        while client.get(render_id)["state"] not in ("failed", "done") and time.monotonic() < deadline:
            time.sleep(0.3)
        token = (tmp_data / "token").read_text().strip()
        result = subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", "status", render_id,
                                 "--coordinator", client.address],
                                capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, "FARM_TOKEN": token})
    assert "failed" in result.stdout, result.stdout
    assert "on w1" in result.stdout and "vae_decoder.safetensors: missing tensor" in result.stdout, result.stdout
