"""A replicated set on one machine: a primary, N replicas and three sentinels, for tests and small farms
(`farm up --redis-replicas N`). Each member is the embedded server (redis_server.py) on a free port of
127.0.0.1 with its data folder under DATA; the sentinels are the same binary with `--sentinel`.

The sentinels mark the primary down after DOWN_AFTER_MS without an answer and promote the most
up-to-date replica; clients reach the set by its redis+sentinel:// URL (sentinel.py) and follow. A
farm whose Macs each run one member survives losing any one of them; on one machine this shows the
mechanism. At stop the current primary's name is written to DATA/redis-primary, so the next start
serves from the newest data, not from a demoted member's.
"""

from __future__ import annotations

import logging
import secrets
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import redis

from coordinator.state.redis_server import EmbeddedRedis, find_redis_server, free_port

log = logging.getLogger(__name__)

MASTER = "farm"
SENTINELS = 3
QUORUM = 2
DOWN_AFTER_MS = 1000   # a primary silent this long is down (subjectively; two sentinels agree: failover)
FAILOVER_TIMEOUT_MS = 3000
PRIMARY_FILE = "redis-primary"
REVIVE_EVERY_S = 2.0


class ReplicatedRedis:
    """Context manager: start the set (primary, replicas in sync, sentinels that see each other) and
    stop it (sentinels first, so stopping is no failover)."""

    def __init__(self, data_dir: Path, replicas: int = 1, *, persistence: bool = True,
                 start_timeout_s: float = 20.0, down_after_ms: int = DOWN_AFTER_MS, revive: bool = False) -> None:
        """revive: start a member that died again, as a replica of the current primary (farm up), so
        the set is whole again seconds after a failover."""
        if replicas < 1:
            raise ValueError(f"a replicated set needs at least one replica, not {replicas}")
        self.data_dir = Path(data_dir)
        self.replicas = replicas
        self.persistence = persistence
        self.start_timeout_s = start_timeout_s
        self.down_after_ms = down_after_ms
        self.server_bin = find_redis_server()
        self.members: list[EmbeddedRedis] = []
        self.sentinel_ports: list[int] = []
        self.sentinels: list[subprocess.Popen] = []
        self.revive = revive
        self._halt = threading.Event()
        self._reviver: threading.Thread | None = None

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{MASTER}"

    def _names(self) -> list[str]:
        """Member folder names, the one to serve from first (the primary at the last stop)."""
        names = ["redis", *(f"redis-replica-{i + 1}" for i in range(self.replicas))]
        marker = self.data_dir / PRIMARY_FILE
        last = marker.read_text().strip() if marker.is_file() else ""
        return [last, *(n for n in names if n != last)] if last in names else names

    def start(self) -> ReplicatedRedis:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            first, *rest = self._names()
            primary = self._member(first, ())
            for name in rest:
                self._member(name, ("--replicaof", "127.0.0.1", str(primary.port)))
            self._wait(lambda: self._online_replicas(primary) >= self.replicas, "replicas in sync")
            peers = [(free_port(), secrets.token_hex(20)) for _ in range(SENTINELS)]
            for i in range(SENTINELS):
                self._start_sentinel(i + 1, primary.port, peers, i)
            self._wait(self._sentinels_ready, "sentinels that see each other and the replicas")
        except BaseException:
            self.stop()
            raise
        if self.revive:
            self._halt.clear()
            self._reviver = threading.Thread(target=self._revive_loop, name="redis-revive", daemon=True)
            self._reviver.start()
        return self

    def revive_dead(self) -> list[str]:
        """Start each member that died again as a replica of the primary the sentinels name now (once
        they promoted one); the sentinels adopt it. Returns the folders revived."""
        primary = self.primary()
        if primary is None or primary.proc is None or primary.proc.poll() is not None or not self._settled(primary):
            return []
        revived = []
        for member in self.members:
            if member is primary or member.proc is None or member.proc.poll() is None:
                continue
            member.extra_args = ("--repl-diskless-sync-delay", "0", "--replicaof", "127.0.0.1", str(primary.port))
            member.start()
            log.info("redis: %s started again as a replica of %s", member.data_dir.name, primary.port)
            revived.append(member.data_dir.name)
        return revived

    def _settled(self, primary: EmbeddedRedis) -> bool:
        """Every sentinel names this primary and none is failing over or finds it down: a member started
        sooner could be promoted by a failover still under way, next to the primary it copies (two
        primaries, one of them stale)."""
        for port in self.sentinel_ports:
            try:
                state = _client(port).sentinel_master(MASTER)
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                return False
            flags = state.get("flags", "")
            flags = set(flags.split(",")) if isinstance(flags, str) else set(flags)
            if flags != {"master"} or int(state.get("port", 0)) != primary.port:
                return False
        return True

    def _revive_loop(self) -> None:
        while not self._halt.wait(REVIVE_EVERY_S):
            try:
                self.revive_dead()
            except (OSError, RuntimeError, redis.RedisError) as exc:
                log.warning("redis: could not start a member again (%s); trying again", exc)

    def _member(self, name: str, extra: tuple[str, ...]) -> EmbeddedRedis:
        # A replica's first sync starts at once (the default waits 5 s for more replicas to share it).
        member = EmbeddedRedis(self.data_dir / name, unix_socket=False, persistence=self.persistence,
                               server_bin=self.server_bin,
                               extra_args=("--repl-diskless-sync-delay", "0", *extra)).start()
        self.members.append(member)
        return member

    def _start_sentinel(self, index: int, primary_port: int, peers: list[tuple[int, str]], me: int) -> None:
        """One sentinel; it is told its id, its peers and the replicas up front, so it need not wait
        for their hello messages (seconds) before it could vote."""
        folder = self.data_dir / f"sentinel-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        port, myid = peers[me]
        known = [f"sentinel known-sentinel {MASTER} 127.0.0.1 {p} {i}" for j, (p, i) in enumerate(peers) if j != me]
        known += [f"sentinel known-replica {MASTER} 127.0.0.1 {m.port}" for m in self.members[1:]]
        conf = folder / "sentinel.conf"  # written fresh each start: the sentinel rewrites it as it learns
        conf.write_text("\n".join([
            f"port {port}", "bind 127.0.0.1", "daemonize no", f'dir "{folder}"',
            f'logfile "{folder / "sentinel.log"}"',
            f"sentinel myid {myid}",
            f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} {QUORUM}",
            f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}",
            f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {MASTER} 1", *known, ""]))
        proc = subprocess.Popen([str(self.server_bin), str(conf), "--sentinel"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        self.sentinels.append(proc)
        self.sentinel_ports.append(port)

    def _online_replicas(self, primary: EmbeddedRedis) -> int:
        info = _client(primary.port).info("replication")
        return sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                   and v.get("state") == "online")

    def _sentinels_ready(self) -> bool:
        for port, proc in zip(self.sentinel_ports, self.sentinels, strict=True):
            if proc.poll() is not None:
                raise RuntimeError(f"sentinel on port {port} exited ({proc.returncode}); see its sentinel.log")
            state = _client(port).sentinel_master(MASTER)
            if int(state.get("num-other-sentinels", 0)) < SENTINELS - 1 or \
                    int(state.get("num-slaves", 0)) < self.replicas:
                return False
        return True

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            try:
                if ready():
                    return
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"replicated Redis in {self.data_dir}: no {what} within {self.start_timeout_s} s")

    def primary(self) -> EmbeddedRedis | None:
        """The member the sentinels name as primary now (None when none of them answers)."""
        for port in self.sentinel_ports:
            try:
                got = _client(port).sentinel_get_master_addr_by_name(MASTER)
            except (redis.ConnectionError, redis.TimeoutError):
                continue
            if got:
                return next((m for m in self.members if m.port == int(got[1])), None)
        return None

    def stop(self) -> None:
        """Sentinels first (no failover while the members stop), the primary's name kept, then members."""
        self._halt.set()
        if self._reviver is not None:
            self._reviver.join(10)
            self._reviver = None
        current = self.primary() if self.sentinels else None
        for proc in self.sentinels:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.sentinels:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.sentinels, self.sentinel_ports = [], []
        if current is not None and current.proc is not None and current.proc.poll() is None:
            (self.data_dir / PRIMARY_FILE).write_text(current.data_dir.name + "\n")
        for member in reversed(self.members):
            member.stop()
        self.members = []

    def __enter__(self) -> ReplicatedRedis:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True, socket_timeout=1,
                       socket_connect_timeout=1)
