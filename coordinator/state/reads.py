"""StoreReads: FarmStore's read side, plain Redis commands that change nothing.

Split from store.py (the size rule): transitions are Lua scripts there, reads are here, and both
decode hashes the same way. A dashboard may see a moment between scripts; that is by design.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from coordinator.state.sentinel import health_line, replication_health

_TASK_JSON = ("params", "input_refs", "inputs", "deps", "outputs", "metrics", "progress", "made_by")
_TASK_INT = ("attempts", "max_attempts", "fence", "leased_ms", "deadline_ms", "queued_ms", "done_ms", "seq",
             "failures", "lost", "stuck_ms", "lead")
_RENDER_INT = ("created_ms", "started_ms", "finished_ms", "remaining", "total", "priority")
_WORKER_INT = ("registered_ms", "last_seen_ms", "tasks_done", "failures", "busy_ms", "lost")


def _decode(raw: dict[str, str], json_fields: tuple[str, ...], int_fields: tuple[str, ...]) -> dict[str, Any]:
    """A Redis hash as plain Python values (JSON fields parsed, counters as int)."""
    out: dict[str, Any] = dict(raw)
    for f in json_fields:
        if out.get(f):
            out[f] = json.loads(out[f])
    for f in int_fields:
        if f in out:
            out[f] = int(out[f] or 0)
    return out


def reply_pairs(flat: list) -> dict[str, str]:
    """A flat [field, value, ...] script reply as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


class StoreReads:
    """Reads of renders, tasks, events, workers, the leader lease and blob records; FarmStore adds
    the Lua transitions on top (it sets client and prefix)."""

    client: redis.Redis
    prefix: str

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def get_render(self, render_id: str) -> dict | None:
        raw = self.client.hgetall(self.key("render", render_id))
        return self._render(render_id, raw) if raw else None

    def list_renders(self, limit: int = 50) -> list[dict]:
        """Newest first."""
        ids = self.client.zrevrange(self.key("renders"), 0, max(0, limit - 1)) if limit > 0 else []
        pipe = self.client.pipeline(transaction=False)
        for rid in ids:
            pipe.hgetall(self.key("render", rid))
        return [self._render(rid, raw) for rid, raw in zip(ids, pipe.execute(), strict=True) if raw]

    def render_tasks(self, render_id: str) -> list[dict]:
        """The render's tasks in plan order."""
        ids = self.client.lrange(self.key("render", render_id, "tasks"), 0, -1)
        pipe = self.client.pipeline(transaction=False)
        for tid in ids:
            pipe.hgetall(self.key("task", tid))
        return [self._task(raw, tid) for tid, raw in zip(ids, pipe.execute(), strict=True) if raw]

    def get_task(self, task_id: str) -> dict | None:
        """The task; `inputs` is {name: sha} once it is queued (all deps done), {} before."""
        raw = self.client.hgetall(self.key("task", task_id))
        return self._task(raw, task_id) if raw else None

    def queue_depths(self) -> dict[str, int]:
        caps = sorted(self.client.smembers(self.key("capabilities")))
        pipe = self.client.pipeline(transaction=False)
        for cap in caps:
            pipe.zcard(self.key("ready", cap))
        return dict(zip(caps, pipe.execute(), strict=True))

    def _render(self, render_id: str, raw: dict[str, str]) -> dict:
        out = _decode(raw, ("spec",), _RENDER_INT)
        out["blocklist"] = str(out.get("blocklist") or "").split()
        return {"id": render_id, **out}

    def _task(self, raw: dict[str, str], task_id: str) -> dict:
        out = _decode(raw, _TASK_JSON, _TASK_INT)
        out["failed_on"] = str(out.get("failed_on") or "").split()
        out["ranks"] = str(out.get("ranks") or "").split()  # a gang's workers, rank 0 first (lua/gang.lua)
        return {"id": task_id, **out}

    def read_events(self, render_id: str, last_id: str = "0", block_ms: int = 0,
                    count: int = 200) -> list[tuple[str, dict]]:
        """Events after last_id, oldest first; with block_ms > 0 wait that long for the first one."""
        timeout = self.client.connection_pool.connection_kwargs.get("socket_timeout")
        if block_ms > 0 and timeout is not None and block_ms / 1000 >= timeout:
            raise ValueError(f"block_ms {block_ms} needs a client socket_timeout above {block_ms / 1000} s")
        resp = self.client.xread({self.key("events", render_id): last_id}, count=count,
                                 block=block_ms if block_ms > 0 else None)
        entries = next(iter(resp.values())) if isinstance(resp, dict) else (resp[0][1] if resp else [])
        return [(eid, json.loads(fields["e"])) for eid, fields in entries]

    def read_event_streams(self, positions: dict[str, str], block_ms: int = 0,
                           count: int = 200) -> dict[str, list[tuple[str, dict]]]:
        """Events of several renders, each after its own id, in one XREAD: the Watch hub's one read for
        every watcher (coordinator/api/watchhub.py)."""
        timeout = self.client.connection_pool.connection_kwargs.get("socket_timeout")
        if block_ms > 0 and timeout is not None and block_ms / 1000 >= timeout:
            raise ValueError(f"block_ms {block_ms} needs a client socket_timeout above {block_ms / 1000} s")
        streams = {self.key("events", rid): last for rid, last in positions.items()}
        resp = self.client.xread(streams, count=count, block=block_ms if block_ms > 0 else None)
        pairs = resp.items() if isinstance(resp, dict) else (resp or [])
        cut = len(self.key("events", ""))
        return {str(name)[cut:]: [(eid, json.loads(fields["e"])) for eid, fields in entries]
                for name, entries in pairs}

    def render_states(self, render_ids: list[str]) -> dict[str, str | None]:
        """The state of each render (None for one that is gone), in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for rid in render_ids:
            pipe.hget(self.key("render", rid), "state")
        return dict(zip(render_ids, pipe.execute(), strict=True))

    def renders_to_assemble(self) -> list[str]:
        """Renders whose every task is done but that have not ended (their assembly is due)."""
        return sorted(self.client.smembers(self.key("to_assemble")))

    def worker_draining(self, worker_id: str) -> bool:
        return self.client.hget(self.key("worker", worker_id), "drain") == "1"

    def list_workers(self) -> list[dict]:
        ids = sorted(self.client.smembers(self.key("workers")))
        pipe = self.client.pipeline(transaction=False)
        for wid in ids:
            pipe.hgetall(self.key("worker", wid))
        return [self._worker(wid, raw) for wid, raw in zip(ids, pipe.execute(), strict=True) if raw]

    def worker_stats(self, worker_id: str) -> dict[str, float]:
        """Counters kept by the complete/fail/expiry scripts."""
        w = self._worker(worker_id, self.client.hgetall(self.key("worker", worker_id)))
        return {"tasks_done": w["tasks_done"], "failures": w["failures"], "busy_s": w["busy_s"], "lost": w["lost"]}

    def _worker(self, worker_id: str, raw: dict[str, str]) -> dict:
        w = _decode(raw, ("info", "pack_sync"), _WORKER_INT)
        for f in ("tasks_done", "failures", "busy_ms", "lost"):
            w.setdefault(f, 0)
        w["busy_s"] = w["busy_ms"] / 1000.0
        w["blocklisted"] = str(w.get("blocklisted") or "").split()
        return {"id": worker_id, **w}

    def leader(self) -> dict:
        """The lease as stored (node, address, epoch, deadline_ms), {} before any coordinator ran."""
        return self.client.hgetall(self.key("leader"))

    def blob_shas(self) -> list[str]:
        """Every blob the farm has a record of (a SCAN: retention's sweep, not a hot path)."""
        start = len(self.key("blob", ""))
        return [k[start:] for k in self.client.scan_iter(match=self.key("blob", "*"), count=1000)
                if len(k) - start == 64]

    def now_ms(self) -> int:
        """Redis TIME in milliseconds: the farm's one clock."""
        sec, usec = self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    def redis_health(self) -> dict:
        """The Redis set's health: mode, primary, replicas (state, lag), sentinels that see the primary,
        and `line`, one sentence for people; {"mode": "down", "line": ...} when the primary does not
        answer."""
        try:
            health = replication_health(self.client)
        except (redis.RedisError, OSError) as exc:
            return {"mode": "down", "line": f"Redis: not answering ({type(exc).__name__}: {exc})"}
        return health | {"line": health_line(health)}

    def server_cpu_s(self) -> float:
        """Seconds of CPU the Redis server has used (user + system): what a bench charges to Redis."""
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def blob_sizes(self, shas: list[str]) -> dict[str, int]:
        """Sizes of blobs by sha256 (one pipelined read); unknown blobs are left out."""
        pipe = self.client.pipeline(transaction=False)
        for sha in shas:
            pipe.hget(self.key("blob", sha), "size")
        return {sha: int(size) for sha, size in zip(shas, pipe.execute(), strict=True) if size is not None}

    def kind_times(self, kinds: list[str]) -> dict[str, tuple[int, float]]:
        """(tasks finished, their summed lease-to-done ms) per task kind, as complete.lua counts them;
        kinds never finished are left out."""
        pipe = self.client.pipeline(transaction=False)
        for kind in kinds:
            pipe.hmget(self.key("kindtime", kind), "n", "sum_ms")
        return {kind: (int(n), float(sum_ms or 0)) for kind, (n, sum_ms) in zip(kinds, pipe.execute(), strict=True)
                if n and int(n) > 0}

    def cost_ratio_hashes(self, worker_ids: list[str], what: str = "costratio",
                          ) -> tuple[list[dict[str, str]], dict[str, str]]:
        """The raw per-kind hashes complete.lua keeps (`{p}:<what>:<worker>`), each worker's and the fleet's."""
        pipe = self.client.pipeline(transaction=False)
        for wid in worker_ids:
            pipe.hgetall(self.key(what, wid))
        pipe.hgetall(self.key(f"{what}_fleet"))
        *each, fleet = pipe.execute()
        return each, fleet

    def render_attempts(self, render_id: str) -> list[dict]:
        """The render's ended leases, oldest first (record_attempt in common.lua)."""
        return [json.loads(r) for r in self.client.lrange(self.key("render", render_id, "attempts"), 0, -1)]

    def farm_attempts(self, since_ms: int) -> list[dict]:
        """Every lease of the farm that ended since `since_ms` (kept two hours), oldest first."""
        return [json.loads(r) for r in self.client.zrangebyscore(self.key("attempts"), since_ms, "+inf")]

    def leased_tasks(self) -> list[dict]:
        """The tasks leased now (running or fetching inputs), whoever holds them."""
        ids = self.client.zrange(self.key("leases"), 0, -1)
        pipe = self.client.pipeline(transaction=False)
        for tid in ids:
            pipe.hgetall(self.key("task", tid))
        return [self._task(raw, tid) for tid, raw in zip(ids, pipe.execute(), strict=True) if raw]

    def read_feed(self, count: int = 100) -> list[dict]:
        """The farm's event feed (workers lost or drained, leases lost, retries, blocklists), newest first."""
        return [json.loads(fields["e"]) for _id, fields in self.client.xrevrange(self.key("feed"), count=count)]

    def newest_event_id(self, render_id: str) -> str:
        """The id of the render's newest event ("0" before any): where a live follower starts."""
        newest = self.client.xrevrange(self.key("events", render_id), count=1)
        return newest[0][0] if newest else "0"

    def newest_render_ids(self, limit: int) -> list[str]:
        """The ids of the newest `limit` renders, newest first."""
        return self.client.zrevrange(self.key("renders"), 0, limit - 1) if limit > 0 else []

    def get_blob_ref(self, sha: str) -> dict | None:
        raw = self.client.hgetall(self.key("blob", sha))
        if not raw:
            return None
        return {"sha": sha, "path": raw["path"], "size": int(raw["size"]), "created_ms": int(raw.get("created_ms", 0))}
