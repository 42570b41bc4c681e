"""The farm's state on a replicated set: Redis (or Valkey) Sentinel URLs, clients that follow the
primary across a failover, the replica acknowledgement rule, and the set's health.

`redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]` (or `valkey+sentinel://`, a `:PASSWORD@` for
the data servers before the hosts) names the sentinels and the master they watch. redis-py's
SentinelConnectionPool asks the sentinels for the primary on every new connection and drops
connections to a demoted one (READONLY), so a client follows a failover by itself; what the farm adds is
here: a write that changes a render's fate waits for a replica's acknowledgement (WAIT) before the
coordinator answers, so a failover cannot lose it (FarmStore, store.py).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

log = logging.getLogger(__name__)

SCHEMES = ("redis+sentinel", "valkey+sentinel")
WAIT_MS_ENV = "FARM_REDIS_WAIT_MS"
WAIT_MS_DEFAULT = 1000  # a replica on the LAN acknowledges in well under a millisecond
PROBE_WAIT_MS = 10  # while no replica acknowledges: a short WAIT notices one coming back
FULL_WAIT_EVERY_S = 5.0
SENTINEL_TIMEOUT_S = 1.0  # a sentinel that does not answer in a second is skipped for the next


@dataclass(frozen=True)
class SentinelUrl:
    """What a sentinel URL names: the sentinels, the master's name, the database and its password."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    password: str | None = None

    def __str__(self) -> str:
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.master}" + (f"/{self.db}" if self.db else "")


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SCHEMES


def _host_port(part: str, url: str) -> tuple[str, int]:
    host, sep, port = part.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"sentinel URL {url!r}: {part!r} is not HOST:PORT "
                         f"(want redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER)")
    return host.strip("[]"), int(port)


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The URL's parts, or a ValueError whose text says what is wrong in one line."""
    if not is_sentinel_url(url):
        raise ValueError(f"{url!r} is not a sentinel URL ({' or '.join(s + '://' for s in SCHEMES)})")
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    password = unquote(parts.netloc.rpartition("@")[0].partition(":")[2]) or None
    if not hosts:
        raise ValueError(f"sentinel URL {url!r} names no sentinel (want redis+sentinel://HOST:PORT[,...]/MASTER)")
    sentinels = tuple(_host_port(part, url) for part in hosts.split(","))
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError(f"sentinel URL {url!r} needs the master's name after the hosts: .../MASTER[/DB]")
    if len(path) == 2 and not path[1].isdigit():
        raise ValueError(f"sentinel URL {url!r}: database {path[1]!r} is not a number")
    return SentinelUrl(sentinels, unquote(path[0]), int(path[1]) if len(path) == 2 else 0, password)


def check_redis_url(url: str) -> None:
    """A ValueError (one line) for a URL no client could use: what the CLI checks before it starts."""
    if is_sentinel_url(url):
        parse_sentinel_url(url)
        return
    try:
        redis.connection.parse_url(url)
    except ValueError as exc:
        raise ValueError(f"--redis-url {url!r}: {exc}") from None


def connect_sentinel(url: str, **client_kwargs: object) -> redis.Redis:
    """A client of the set's current primary that follows failovers (the sentinels are asked again
    whenever a connection is made or the old primary says READONLY)."""
    parsed = parse_sentinel_url(url)
    sentinel = Sentinel(list(parsed.sentinels), socket_timeout=SENTINEL_TIMEOUT_S,
                        socket_connect_timeout=SENTINEL_TIMEOUT_S,
                        sentinel_kwargs={"socket_timeout": SENTINEL_TIMEOUT_S, "decode_responses": True,
                                         "socket_connect_timeout": SENTINEL_TIMEOUT_S})
    return sentinel.master_for(parsed.master, db=parsed.db, password=parsed.password, **client_kwargs)


def is_replicated(client: redis.Redis) -> bool:
    """Whether the client reaches a replicated set through sentinels (a plain URL: one server)."""
    return isinstance(client.connection_pool, SentinelConnectionPool)


def replica_wait_ms() -> int:
    """How long a fate-changing write waits for a replica (FARM_REDIS_WAIT_MS, default 1000 ms)."""
    raw = os.environ.get(WAIT_MS_ENV, "").strip()
    try:
        value = int(raw) if raw else WAIT_MS_DEFAULT
    except ValueError:
        raise ValueError(f"{WAIT_MS_ENV}={raw!r} is not a whole number of milliseconds") from None
    if value <= 0:
        raise ValueError(f"{WAIT_MS_ENV}={raw!r} must be above 0")
    return value


class ReplicaAcks:
    """What WAIT answered: one log line when replicas stop acknowledging (writes then stand on the
    primary alone) and one when they are back; meanwhile WAITs are short probes, so the farm does not
    crawl while its replica is away, with a whole wait every FULL_WAIT_EVERY_S, so a replica that is
    back but slower than a probe is waited for again."""

    def __init__(self, wait_ms: int) -> None:
        self.wait_ms = wait_ms
        self.unacked = 0  # fate-changing writes no replica acknowledged in time
        self.degraded = False
        self._full_at = 0.0

    def timeout_ms(self) -> int:
        if not self.degraded or time.monotonic() - self._full_at >= FULL_WAIT_EVERY_S:
            self._full_at = time.monotonic()
            return self.wait_ms
        return PROBE_WAIT_MS

    def record(self, acks: int) -> None:
        if acks >= 1:
            if self.degraded:
                log.info("redis: a replica acknowledges writes again")
            self.degraded = False
            return
        self.unacked += 1
        if not self.degraded:
            log.warning("redis: no replica acknowledged a write within %d ms; writes stand on the primary "
                        "alone until one does", self.wait_ms)
        self.degraded = True


def _replicas(info: dict) -> list[dict]:
    """The primary's INFO replication rows (slaveN) as {address, state, lag_s, behind_bytes}."""
    offset = int(info.get("master_repl_offset", 0))
    rows = [v for k, v in sorted(info.items()) if k.startswith("slave") and isinstance(v, dict)]
    return [{"address": f"{r.get('ip')}:{r.get('port')}", "state": str(r.get("state", "")),
             "lag_s": int(r.get("lag", -1)), "behind_bytes": max(0, offset - int(r.get("offset", 0)))}
            for r in rows]


def _sentinels_seeing(client: redis.Redis, primary: str) -> list[dict]:
    """Each sentinel and whether it names `primary` as the master (it is reachable and agrees)."""
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    seen = []
    for s in pool.sentinel_manager.sentinels:
        kwargs = s.connection_pool.connection_kwargs
        address = f"{kwargs.get('host')}:{kwargs.get('port')}"
        try:
            got = s.sentinel_get_master_addr_by_name(pool.service_name)
            sees = bool(got) and f"{got[0]}:{got[1]}" == primary
        except (redis.RedisError, OSError):
            sees = False
        seen.append({"address": address, "sees_master": sees})
    return seen


def replication_health(client: redis.Redis) -> dict:
    """The set as the farm sees it: mode ('single' or 'sentinel'), the primary's address, its replicas
    (state, lag) and, through sentinels, which of them see that primary. Raises a redis error when the
    primary does not answer."""
    info = client.info("replication")
    replicas = _replicas(info)
    health: dict = {"mode": "single", "role": str(info.get("role", "")), "replicas": replicas,
                    "replicas_online": sum(r["state"] == "online" for r in replicas)}
    if not is_replicated(client):
        return health
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    host, port = pool.sentinel_manager.discover_master(pool.service_name)
    primary = f"{host}:{port}"
    sentinels = _sentinels_seeing(client, primary)
    return health | {"mode": "sentinel", "master": pool.service_name, "primary": primary,
                     "sentinels": sentinels, "sentinels_seeing": sum(s["sees_master"] for s in sentinels)}


def health_line(health: dict) -> str:
    """One line for people: `farm doctor`, the dashboard, logs."""
    if health.get("mode") != "sentinel":
        return f"Redis: one server ({health.get('role') or 'master'}), not replicated"
    lags = ", ".join(f"{r['address']} {r['state']} lag {r['lag_s']} s" for r in health["replicas"]) or "none"
    return (f"Redis: primary {health['primary']} ({health['master']}); replicas {health['replicas_online']}/"
            f"{len(health['replicas'])} online ({lags}); sentinels seeing it "
            f"{health['sentinels_seeing']}/{len(health['sentinels'])}")
