"""No dead window for clients: a `farm submit` started while a standby takes over
from a killed leader waits for the new leader and lands (exit 0, one line saying it waits); a paused old
leader that wakes up logs one line per loop that lost its epoch, never a traceback; a gRPC error in a
retry line reads as its status code and details."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time

import grpc
import pytest

from coordinator.api.auth import load_or_create_token
from protos.retry import Outage, describe
from tests.farm.farm_harness import ROOT
from tests.farm.test_failover import CLI, free_port, serving_after, start_coordinator, stop_all

LOOPS = ("lease expiry", "reducer")  # the loops that write every pass (webhooks, retention: when due)


def _log(path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.timeout(120)
def test_a_submit_started_during_a_takeover_waits_for_the_new_leader_and_lands(store, redis_url, tmp_data):
    token = load_or_create_token(tmp_data)
    ports = free_port(), free_port()
    leader, standby = (f"127.0.0.1:{p}" for p in ports)
    procs = [start_coordinator(redis_url, tmp_data, ports[0], "coord-a")]
    try:
        serving_after(leader, token, time.monotonic())
        procs.append(start_coordinator(redis_url, tmp_data, ports[1], "coord-b"))
        time.sleep(1.0)  # the standby is up and has seen the leader's lease
        os.kill(procs[0].pid, signal.SIGKILL)
        submit = subprocess.run([*CLI, "submit", "-p", "a fox", "-H", "128", "-W", "128", "-f", "9", "--pack", "tiny",
                                 "--coordinator", f"{leader},{standby}"], capture_output=True, text=True, timeout=60,
                                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "FARM_TOKEN": token})
        assert submit.returncode == 0, submit.stderr[-3000:]
        assert submit.stderr.count("waiting up to") == 1, submit.stderr[-3000:]
        assert store.leader()["address"] == standby
        assert len(store.list_renders(5)) == 1, submit.stdout  # queued once, by the new leader
    finally:
        stop_all(procs)


@pytest.mark.timeout(120)
def test_a_paused_old_leader_logs_one_line_per_loop_that_lost_its_epoch(store, redis_url, tmp_data):
    token = load_or_create_token(tmp_data)
    ports = free_port(), free_port()
    first, second = (f"127.0.0.1:{p}" for p in ports)
    procs = [start_coordinator(redis_url, tmp_data, ports[0], "coord-a")]
    try:
        serving_after(first, token, time.monotonic())
        procs.append(start_coordinator(redis_url, tmp_data, ports[1], "coord-b"))
        os.kill(procs[0].pid, signal.SIGSTOP)
        serving_after(second, token, time.monotonic())
        os.kill(procs[0].pid, signal.SIGCONT)
        deadline = time.monotonic() + 20
        while "standing by" not in _log(tmp_data / "coord-a.log") and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # every loop has had a pass under the old epoch
        text = _log(tmp_data / "coord-a.log")
        assert "Traceback" not in text and " ERROR " not in text, text[-4000:]
        for loop in LOOPS:
            assert text.count(f"{loop}: this coordinator lost its epoch") <= 1, text[-4000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        stop_all(procs)


class _Status(grpc.RpcError):
    """A gRPC error as the channel raises it: code() and details(), and a many-line str()."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "failed to connect to all addresses; last error: Connection refused"

    def __str__(self) -> str:
        return "<_MultiThreadedRendezvous of RPC that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n>"


@pytest.mark.timeout(10)
def test_a_presence_retry_line_carries_the_status_code_and_details(caplog):
    caplog.set_level(logging.INFO)
    assert describe(_Status()) == "UNAVAILABLE: failed to connect to all addresses; last error: Connection refused"
    Outage("presence stream", logging.getLogger("farm.worker")).failed(_Status())
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("presence stream: UNAVAILABLE: failed to connect") and "Rendezvous" not in line
