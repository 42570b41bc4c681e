"""The service commands as a user meets them: a second `farm up` on a busy port, `farm worker --help`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordinator.state.redis_server import free_port
from tests.farm.farm_harness import ROOT

FARM = [sys.executable, "-c", "from farm_cli.main import main; main()"]


def _env(data: Path) -> dict:
    return {**os.environ, "FARM_DATA": str(data), "PYTHONPATH": str(ROOT)}


def _farm(*args: str, data: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*FARM, *args], capture_output=True, text=True, timeout=timeout, env=_env(data), cwd=ROOT)


def _one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


@pytest.mark.timeout(180)
def test_second_farm_up_on_busy_ports_says_so_in_one_line(tmp_path: Path) -> None:
    port, dash = free_port(), free_port()
    first_data, other_data = tmp_path / "a", tmp_path / "b"
    log = open(tmp_path / "first.log", "w+")  # noqa: SIM115 - the process writes it until we stop it
    first = subprocess.Popen([*FARM, "up", "--workers", "0", "--port", str(port), "--dashboard-port", str(dash)],
                             stdout=log, stderr=subprocess.STDOUT, env=_env(first_data), cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while "farm up: coordinator" not in (tmp_path / "first.log").read_text() and time.monotonic() < deadline:
            assert first.poll() is None, (tmp_path / "first.log").read_text()
            time.sleep(0.2)
        _logs_in_with_the_printed_link((tmp_path / "first.log").read_text(), first_data, dash)
        same = _farm("up", "--workers", "0", "--port", str(free_port()), "--dashboard-port", str(free_port()),
                     data=first_data)
        assert same.returncode == 1
        assert "already" in _one_line(same) and str(first_data) in same.stderr
        other = _farm("up", "--workers", "0", "--port", str(port), "--dashboard-port", str(free_port()),
                      data=other_data)
        assert other.returncode == 2 and f"port {port}" in _one_line(other) and "in use" in other.stderr
        dash_busy = _farm("up", "--workers", "0", "--port", str(free_port()), "--dashboard-port", str(dash),
                          data=other_data)
        assert dash_busy.returncode == 2 and f"dashboard port {dash}" in _one_line(dash_busy)
        coord = _farm("coordinator", "--port", str(port), "--dashboard-port", str(free_port()), data=other_data)
        assert coord.returncode == 2 and f"port {port}" in _one_line(coord)
    finally:
        first.terminate()
        first.wait(timeout=30)
        log.close()


def test_farm_worker_help_lists_its_options(tmp_path: Path) -> None:
    result = _farm("worker", "--help", data=tmp_path)
    assert result.returncode == 0, result.stderr
    for option in ("--coordinator", "--token-file", "--worker-id", "--packs-dir", "--cache-dir", "--max-tasks",
                   "--pack-max-mbps", "--drain"):
        assert option in result.stdout, (option, result.stdout)


def test_farm_worker_without_coordinator_is_one_line(tmp_path: Path) -> None:
    env = _env(tmp_path)
    env.pop("FARM_COORDINATOR", None)
    result = subprocess.run([*FARM, "worker"], capture_output=True, text=True, timeout=60,
                            env={**env, "FARM_TOKEN": "x"}, cwd=ROOT)
    assert result.returncode == 2 and "--coordinator" in _one_line(result)


def _logs_in_with_the_printed_link(output: str, data: Path, dash: int) -> None:
    """`farm up` prints a dashboard link that logs in: the farm's secret in the query, traded
    by the dashboard for the session cookie and a redirect to the clean URL."""
    import http.client

    from protos.auth import JoinToken

    secret = JoinToken.parse((data / "token").read_text()).secret
    link = f"http://127.0.0.1:{dash}/?token={secret}"
    assert f"dashboard {link}" in output, output
    conn = http.client.HTTPConnection("127.0.0.1", dash, timeout=10)
    conn.request("GET", link.split(str(dash), 1)[1])
    reply = conn.getresponse()
    assert reply.status == 303 and reply.getheader("location") == "/"
    assert "farm_session=" in (reply.getheader("set-cookie") or "")
    conn.close()
