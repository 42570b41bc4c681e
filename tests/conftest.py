"""Shared fixtures: one throwaway redis-server per test session (real Redis, never a fake) and a data dir;
and the CI rule: under CI=true a skip for a missing need (tests/needs.py) is a failure naming it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from coordinator.leadership import Leadership
from coordinator.state.redis_server import EmbeddedRedis, connect
from coordinator.state.store import FarmStore
from tests.needs import missing_need, on_ci


def _failed_for_need(report: pytest.CollectReport | pytest.TestReport) -> None:
    """Turn a skip whose reason is a missing need into a failure that names it (CI provisions them all)."""
    if not (report.skipped and on_ci()) or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    need = missing_need(reason)
    if need is not None:
        report.outcome = "failed"
        report.longrepr = f"CI=true and {need} is missing, so this part of the suite did not run: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
    report = yield
    _failed_for_need(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[pytest.CollectReport]:
    """A module-level pytest.importorskip skips the whole module at collection: the same rule holds."""
    report = yield
    _failed_for_need(report)
    return report

# Coordinators the tests start stay off the LAN's mDNS (each announcement would multicast from this
# machine); the `farm join` tests turn it on inside their own network namespace.
os.environ.setdefault("FARM_ANNOUNCE", "0")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A redis-server on a unix socket in a tmp dir, without persistence (tests flush it anyway)."""
    with EmbeddedRedis(tmp_path_factory.mktemp("redis"), persistence=False) as server:
        yield server


@pytest.fixture(scope="module", autouse=True)
def no_coordinator_outlives_its_module() -> Iterator[None]:
    """A coordinator a module leaves running goes on claiming the lease in this process's Redis after every
    flush, so each later coordinator here stands by and its module fails for nothing of its own: resign
    it, and fail the module that left it instead."""
    yield
    deadline = time.monotonic() + 6  # a stopping coordinator's claim loop may take a moment to end
    while (left := [t for t in threading.enumerate() if isinstance(t, Leadership) and t.is_alive()]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for leadership in left:
        leadership.release()
    assert not left, f"{len(left)} coordinator(s) left running by this module: stop every one it serves"


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    """The session server's URL, emptied (FLUSHDB) before the test."""
    client = connect(redis_server.url)
    client.flushdb()
    client.close()
    return redis_server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = connect(redis_url)
    yield client
    client.close()


@pytest.fixture
def store(redis_client: redis.Redis) -> FarmStore:
    return FarmStore(redis_client)


@pytest.fixture
def tmp_data(tmp_path: Path) -> Path:
    """An empty farm data folder."""
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def tiny_packs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packs folder holding the tiny pack as `tiny` (the real layout at tiny sizes), written once."""
    from ltx_engine.tiny.tiny_pack import write_tiny_pack

    folder = tmp_path_factory.mktemp("packs")
    write_tiny_pack(folder / "tiny", seed=0)
    return folder


@pytest.fixture(scope="session")
def local_runner(tiny_packs: Path):
    """One in-process Runner for the session: models stay warm between reference renders."""
    from worker.runner import Runner

    return Runner(tiny_packs)
