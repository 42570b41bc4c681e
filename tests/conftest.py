"""Shared fixtures: one throwaway redis-server per test session (real Redis, never a fake) and a data dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from coordinator.state.redis_server import EmbeddedRedis, connect
from coordinator.state.store import FarmStore


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A redis-server on a unix socket in a tmp dir, without persistence (tests flush it anyway)."""
    with EmbeddedRedis(tmp_path_factory.mktemp("redis"), persistence=False) as server:
        yield server


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
    from ltx_engine.tiny_pack import write_tiny_pack

    folder = tmp_path_factory.mktemp("packs")
    write_tiny_pack(folder / "tiny", seed=0)
    return folder


@pytest.fixture(scope="session")
def local_runner(tiny_packs: Path):
    """One in-process Runner for the session: models stay warm between reference renders."""
    from worker.runner import Runner

    return Runner(tiny_packs)
