"""A worker that goes silent without a TCP reset (SIGSTOP; its packets dropped in a network namespace)
loses its lease through HTTP/2 keepalive (its presence stream breaks), before the 30 s deadline would
take it, and the result it sends once it speaks again is refused STALE. Real processes: the coordinator,
a worker agent on MLX. How soon keepalive notices is a figure for `farm bench silent`, not a bound here."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from farm_cli.bench.silent import NETNS_TOOLS, SPEC, Partition, one_worker_farm, silence_once
from tests.needs import require_program, skip_missing

WAIT_S = 90.0  # past the 30 s deadline: a lease taken back by expiry is seen, and told apart below


def _log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _refused_stale(log_path: Path, task_id: str, timeout: float = 60) -> str:
    """The worker's log line that says the coordinator refused its late result (or beat) as STALE."""
    # its Complete refused, or its Fail (with the fault class the worker gave it: worker/faults.py) refused
    refused = re.compile(rf"task {re.escape(task_id)}(: STALE| reported failed \(lease lost \(stale\), \w+\): STALE)")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = refused.search(_log(log_path))
        if found:
            return found.group(0)
        time.sleep(0.2)
    raise AssertionError(f"no STALE refusal of {task_id} within {timeout} s\n{_log(log_path)[-3000:]}")


def _taken_back(store, render_id: str, task_id: str) -> tuple[dict, dict]:
    """The silenced worker's lease of the task (its task_leased event) and the event that ended it."""
    events = [e for _, e in store.read_events(render_id, count=100_000) if e.get("task") == task_id]
    ended = next(i for i, e in enumerate(events) if e["type"] in ("task_lost", "task_expired"))
    leased = next(e for e in reversed(events[:ended]) if e["type"] == "task_leased")
    return leased, events[ended]


def _check(client, store, log_path: Path, silence, speak) -> None:
    render_id = client.submit(dict(SPEC))
    measured = silence_once(client, render_id, "w1", silence, speak, timeout=WAIT_S)
    assert measured is not None, _log(log_path)[-3000:]
    leased, ended = _taken_back(store, render_id, measured.task)
    # The presence stream's break took it back (coordinator/api/presence.py), not the lease's expiry, and the
    # farm's own clock put that before the deadline the lease was granted with.
    assert ended["type"] == "task_lost" and ended["reason"] == "w1 went away (connection broke)", ended
    assert ended["ts"] < leased["deadline_ms"], (leased, ended)
    _refused_stale(log_path, measured.task)
    task = store.get_task(measured.task)
    assert int(task.get("attempts", 0)) <= 1 or task["state"] != "failed", task  # handed back, not blamed
    client.cancel(render_id)


@pytest.mark.timeout(150)
def test_a_sigstopped_worker_loses_its_lease_by_keepalive_and_its_late_result_is_stale(store, tmp_data,
                                                                                       tiny_packs) -> None:
    with one_worker_farm(store, tmp_data, tiny_packs) as (client, proc, log_path):
        _check(client, store, log_path, lambda: os.kill(proc.pid, signal.SIGSTOP),
               lambda: os.kill(proc.pid, signal.SIGCONT))
        assert proc.poll() is None, "the worker lives on after its silence"


@pytest.mark.timeout(150)
def test_a_worker_whose_packets_are_dropped_loses_its_lease_by_keepalive(store, tmp_data, tiny_packs) -> None:
    for program in NETNS_TOOLS:
        require_program(program)
    if os.geteuid() != 0:
        skip_missing("privilege", "root", "a network namespace with a DROP rule")
    with Partition() as part, one_worker_farm(store, tmp_data, tiny_packs, part.host_ip, part.wrap()) as (
            client, proc, log_path):
        _check(client, store, log_path, part.drop, part.allow)
        assert proc.poll() is None, "the worker lives on after its partition"
