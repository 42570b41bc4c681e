"""`farm coordinator` logs to DATA/logs/coordinator.log (not only stderr), and `farm doctor` names it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordinator.state.redis_server import free_port
from tests.farm.farm_harness import ROOT

FARM = [sys.executable, "-c", "from farm_cli.main import main; main()"]


def _coordinator(data: Path) -> tuple[subprocess.Popen, dict[str, str], int]:
    """`farm coordinator` on free ports with its data in `data`: the process, its env and its port."""
    env = {**os.environ, "FARM_DATA": str(data), "PYTHONPATH": str(ROOT)}
    port, dash = free_port(), free_port()
    proc = subprocess.Popen([*FARM, "coordinator", "--port", str(port), "--dashboard-port", str(dash)], env=env,
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, env, port


@pytest.mark.timeout(120)
def test_coordinator_writes_its_log_file_and_doctor_names_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, env, port = _coordinator(data)
    log = data / "logs" / "coordinator.log"
    try:
        deadline = time.monotonic() + 60
        while not (log.is_file() and "coordinator listening" in log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "no coordinator.log line"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    doctor = subprocess.run([*FARM, "doctor", "--coordinator", f"127.0.0.1:{port}"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    line = next(x for x in doctor.stdout.splitlines() if "logs:" in x)
    assert str(log) in line


@pytest.mark.timeout(120)
def test_a_coordinator_stopped_while_it_starts_takes_its_redis_with_it(tmp_path: Path) -> None:
    """SIGTERM as soon as the embedded Redis answers (the coordinator still starting): the process ends in
    order and its Redis with it, so the next start on this folder is not refused."""
    import redis

    data = tmp_path / "data"
    url_file = data / "redis" / "redis.url"
    proc, _, _ = _coordinator(data)
    try:
        deadline = time.monotonic() + 60
        while not url_file.is_file():
            assert proc.poll() is None and time.monotonic() < deadline, "the embedded Redis never started"
            time.sleep(0.01)
        url = url_file.read_text().strip()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    with pytest.raises((redis.ConnectionError, OSError)):
        client.ping()
    assert not url_file.exists()
