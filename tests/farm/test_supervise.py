"""`farm up` supervises its workers: a worker killed with SIGKILL is started again (after the first
backoff step, 1 s), registers again, and the reason is logged. A real `farm up` process on the
test's Redis, its real worker processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.farm.farm_harness import ROOT, wait_until
from tests.farm.test_failover import CLI, free_port


def worker_children(pid: int) -> list[int]:
    """Pids of the worker processes `farm up` (pid) started (pgrep: on Linux and macOS alike)."""
    found = subprocess.run(["pgrep", "-P", str(pid), "-f", "worker.agent"], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.timeout(180)
def test_farm_up_restarts_a_killed_worker_and_says_why(store, redis_url, tmp_data, tiny_packs):
    shutil.copytree(tiny_packs / "tiny", tmp_data / "packs" / "tiny")  # farm up finds its tiny pack
    err_path = tmp_data / "up.err"
    cmd = [*CLI, "up", "--workers", "1", "--data", str(tmp_data), "--redis-url", redis_url,
           "--port", str(free_port()), "--dashboard-port", "0"]
    with open(err_path, "wb") as err:
        up = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        registered = lambda: {w["id"]: w["registered_ms"] for w in store.list_workers()}  # noqa: E731
        first = wait_until(lambda: registered().get("worker-1"), 90, "worker-1 registered")
        [child] = wait_until(lambda: worker_children(up.pid), 10, "one worker process")
        secret = (tmp_data / "token").read_text().strip().rsplit(".", 1)[-1]  # the join token's secret part
        shown = subprocess.run(["ps", "-o", "args=", "-p", f"{up.pid},{child}"], capture_output=True, text=True).stdout
        assert "worker.agent" in shown and secret not in shown, shown  # `ps` shows no token
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: registered().get("worker-1", 0) > first, 90, "worker-1 registered again")
        [again] = worker_children(up.pid)
        assert again != child
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=30)
    log = err_path.read_text()
    assert f"worker-1 (pid {child}) killed by SIGKILL" in log and "restarting in 1s" in log, log
    assert f"worker-1 started again (pid {again})" in log, log
    assert f"worker-1 (pid {child}) killed by SIGKILL" in (tmp_data / "logs" / "coordinator.log").read_text()
    assert up.returncode == 0 and wait_until(lambda: gone(again), 10, "the worker stopped with farm up")


@pytest.mark.timeout(30)
def test_a_worker_that_keeps_dying_young_backs_off_and_a_clean_exit_stays_down(tmp_path, caplog):
    """Real processes: one exits 3 at once, again and again (waits 1 s, then 2 s, ...); one exits 0."""
    import sys

    from farm_cli.supervise import Supervisor

    def spawn(cmd: list[str], log: Path) -> subprocess.Popen:
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    crash, clean = [sys.executable, "-c", "raise SystemExit(3)"], [sys.executable, "-c", "pass"]
    sup = Supervisor([("bad", crash, tmp_path / "bad.log"), ("done", clean, tmp_path / "done.log")], spawn,
                     poll_s=0.05)
    caplog.set_level("INFO", logger="farm.up")
    sup.start()
    try:
        wait_until(lambda: sup.restarts[0] >= 2, 10, "two restarts of the crashing worker")
        time.sleep(0.5)
    finally:
        sup.halt()
        for proc in sup.procs:
            proc.wait(timeout=5)
    err = caplog.text
    assert "bad (pid" in err and "exit code 3" in err and "restarting in 1s" in err and "restarting in 2s" in err
    assert "done exited cleanly" in err and sup.restarts[1] == 0
