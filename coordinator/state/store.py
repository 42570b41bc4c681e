"""FarmStore: the farm's state in Redis. Every state change is one Lua script (EVALSHA).

Scripts live in coordinator/state/lua/; common.lua is prepended to each, so a rule (fencing, queueing,
failing a render) has one home. Deadlines come from Redis TIME, the one clock of the farm.
Reads are plain commands: they change nothing, and a dashboard may see a moment between scripts.

Keys under the prefix p (default "farm"):
  {p}:render:{id}             hash  spec (JSON), state, stage, error, output, created_ms, started_ms,
                                    finished_ms, remaining, total, priority
  {p}:renders                 zset  render id -> created ms
  {p}:render:{id}:tasks       list  task ids in plan order
  {p}:task:{id}               hash  render, kind, params, input_refs, inputs (resolved), deps (JSON),
                                    capability, state, attempts, max_attempts, worker, fence, outputs,
                                    error, leased_ms, deadline_ms, queued_ms, done_ms, metrics, progress, seq,
                                    lead (1: the planner's chain, leased first in its priority band)
  {p}:task:{id}:dependents    zset  dependent task id -> its plan position (release in plan order)
  {p}:task:{id}:pending       int   deps not done yet
  {p}:ready:{capability}      zset  queued task ids by (render priority desc, lead first, queue order);
                                    retries and expiries go to the front of their part of the priority
  {p}:qseq                    int   the queue-order counter
  {p}:capabilities            set   every capability that ever had a ready queue
  {p}:leases                  zset  task id -> lease deadline ms
  {p}:fence                   int   the fencing-token counter
  {p}:worker:{id}             hash  info (JSON), state, current_task, registered_ms, last_seen_ms,
                                    tasks_done, failures, busy_ms, drain (1 = finish, take no more, exit)
  {p}:workers                 set   worker ids
  {p}:events:{render}         stream  field "e" = event JSON (with "ts"), MAXLEN ~ events_maxlen
  {p}:blob:{sha}              hash  path, size, created_ms
  {p}:render:{id}:wfail       hash  worker -> tasks of this render that failed on it (blocklist at 3)
  {p}:to_assemble             set   renders whose every task is done and that have not ended yet
  {p}:kindtime:{kind}         hash  n, sum_ms: lease-to-done times of finished tasks (the stuck check)
  {p}:submitters              set   every submitter that ever had a render (one: lease.lua skips fair share)
  {p}:render:{id}:attempts    list  every ended lease of the render (JSON: task, worker, attempt, start_ms,
                                    end_ms, outcome), for the schedule; {p}:attempts the farm's, scored
                                    by end ms, kept 2 h; {p}:feed stream: workers lost/drained, retries
Render hashes also hold blocklist (workers, space-separated); task hashes failures (raised), failed_on
(distinct workers, space-separated), lost (leases lost with a worker), stuck_ms, session (the holder
process); worker hashes session and blocklisted (renders, space-separated).
  {p}:leader                  hash  node, address, epoch, deadline_ms, since_ms (the coordinators' lease)

Task states: waiting (deps pending) -> queued -> leased -> done | failed | cancelled.
Render states: queued -> running (first lease) -> ... (set_render_state) -> done | failed | cancelled.
(The words, and which render states are terminal, are protos/states.py; common.lua keeps its copy.)
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import redis

from coordinator.state.reads import StoreReads, reply_pairs
from coordinator.state.sentinel import ReplicaAcks, is_replicated, replica_wait_ms
from protos.states import Fault, Outcome

LUA_DIR = Path(__file__).with_name("lua")
SCRIPTS = ("create_render", "add_tasks", "set_length", "lease", "heartbeat", "complete", "fail", "expire_leases",
           "cancel_render", "set_render_state", "emit", "register_worker", "worker_seen", "put_blob_ref",
           "set_priority", "requeue_task", "lose_leases", "clear_blocklist", "check_stuck", "leadership", "worker_pack_sync", "drain_worker", "resume_worker", "retry_render",
           "delete_render", "claim_notify", "forget_blob", "forget_workers", "set_policy", "complete_lease")
# Scripts that run others: each part becomes a local function of its own ARGV, ahead of the script's text.
PARTS = {"complete_lease": ("complete", "lease")}
LIBS = {"lease": "gang", "complete_lease": "gang", "heartbeat": "gang"}  # gang leases (lua/gang.lua)
# Transitions that decide a render's fate (its plan, a task's result, its state): on a replicated set
# each is acknowledged by a replica (WAIT) before its caller answers, so a failover cannot lose one.
# WAIT covers every earlier write of the replication stream too (blob refs, leases).
ACKED = frozenset({"create_render", "add_tasks", "set_length", "complete", "complete_lease", "fail",
                   "set_render_state", "cancel_render", "retry_render", "delete_render", "claim_notify",
                   "requeue_task", "leadership"})
_RESERVED_RENDER_FIELDS = frozenset({"state", "spec", "remaining", "total", "created_ms", "started_ms",
                                     "finished_ms", "priority", "type", "previous", "ts"})

# Redis errors that end when the server is back (restart, AOF load, a dropped socket): retried, never fatal.
REDIS_TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def is_transient(exc: BaseException) -> bool:
    """An error the coordinator waits out: Redis away or loading, or a disk/blob I/O error (not a
    missing file, which waiting does not bring back)."""
    if isinstance(exc, REDIS_TRANSIENT):
        return True
    return isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError)


@cache
def _script_source(name: str) -> str:
    """common.lua + the script: one text per operation, loaded once per process."""
    common = (LUA_DIR / "common.lua").read_text()
    common += "\n" + (LUA_DIR / f"{LIBS[name]}.lua").read_text() if name in LIBS else ""
    parts = "".join(f"local function {part}(ARGV)\n{(LUA_DIR / f'{part}.lua').read_text()}\nend\n"
                    for part in PARTS.get(name, ()))
    return common + "\n" + parts + (LUA_DIR / f"{name}.lua").read_text()


def _check_task(t: dict) -> None:
    for field in ("id", "kind", "capability"):
        if not isinstance(t.get(field), str) or not t[field]:
            raise ValueError(f"task needs a non-empty string {field!r}: {t!r}")
    for name, ref in t.get("inputs", {}).items():
        ok = isinstance(ref, dict) and (
            isinstance(ref.get("blob"), str) or (isinstance(ref.get("task"), str) and isinstance(ref.get("output"), str))
        )
        if not ok:
            raise ValueError(f"task {t['id']}: input {name!r} must be {{'blob': sha}} or {{'task': id, 'output': name}}")
    if int(t.get("max_attempts", 3)) < 1:
        raise ValueError(f"task {t['id']}: max_attempts must be >= 1")


def _check_acyclic(tasks: list[dict]) -> None:
    """A cycle inside one batch would leave its tasks waiting forever: refuse it up front."""
    ids = {t["id"] for t in tasks}
    indeg = {t["id"]: sum(d in ids for d in t["deps"]) for t in tasks}
    users: dict[str, list[str]] = {}
    for t in tasks:
        for d in t["deps"]:
            users.setdefault(d, []).append(t["id"])
    todo = [i for i, n in indeg.items() if n == 0]
    seen = 0
    while todo:
        seen += 1
        for u in users.get(todo.pop(), []):
            indeg[u] -= 1
            if indeg[u] == 0:
                todo.append(u)
    if seen != len(tasks):
        raise ValueError("task dependencies form a cycle")


def _tasks_arg(tasks: list[dict]) -> str:
    """Tasks as one JSON argument; params/inputs/deps travel pre-encoded so {} and [] survive Lua."""
    wire = []
    for t in tasks:
        _check_task(t)
        inputs = t.get("inputs") or {}
        deps = list(dict.fromkeys([*t.get("deps", []), *(r["task"] for r in inputs.values() if "task" in r)]))
        wire.append({"id": t["id"], "kind": t["kind"], "capability": t["capability"],
                     "max_attempts": int(t.get("max_attempts", 3)), "params": json.dumps(t.get("params") or {}),
                     "input_refs": json.dumps(inputs), "deps": deps, "deps_json": json.dumps(deps),
                     "lead": 1 if t.get("lead") else 0})
    _check_acyclic(wire)
    return json.dumps(wire)


class NotLeader(RuntimeError):
    """Another coordinator holds the leadership lease now: this one's writes are refused."""


class EpochNotReplicated(redis.ConnectionError):
    """A new leadership epoch no replica holds yet: leading under it could reuse it after a failover,
    so the claim counts as failed (Leadership retries it) until a replica acknowledges it."""


class FarmStore(StoreReads):
    """The coordinator's only door to Redis: atomic transitions here, plain reads and event streams
    in StoreReads (store_reads.py)."""

    def __init__(self, client: redis.Redis, prefix: str = "farm", *, events_maxlen: int = 5000,
                 wait_ms: int | None = None) -> None:
        """wait_ms: how long a fate-changing write waits for a replica (0: never; None: FARM_REDIS_WAIT_MS
        when the client reaches a replicated set through sentinels, else 0 — one server, no WAIT)."""
        self.client = client
        self.prefix = prefix
        self.events_maxlen = events_maxlen
        self.epoch = ""  # the leadership epoch every script is fenced with ('' = unfenced)
        self.wait_ms = (replica_wait_ms() if is_replicated(client) else 0) if wait_ms is None else wait_ms
        self.acks = ReplicaAcks(self.wait_ms)
        self._scripts = {name: client.register_script(_script_source(name)) for name in SCRIPTS}

    def _run(self, name: str, *args: Any) -> Any:
        """EVALSHA (EVAL on a cold server); 'farm: ...' script errors become ValueError."""
        return self._run_acked(name, *args)[0]

    def _run_acked(self, name: str, *args: Any) -> tuple[Any, int | None]:
        """_run, and for a fate-changing script on a replicated set the replicas that acknowledged it
        (None where no WAIT was sent)."""
        keys = [self.epoch] if self.epoch and name != "leadership" else []
        argv = [self.prefix, self.events_maxlen, *args]
        try:
            if self.wait_ms and name in ACKED:
                return self._eval_and_wait(name, keys, argv)
            return self._scripts[name](keys=keys, args=argv), None
        except redis.ResponseError as exc:
            if str(exc).startswith("farm: not the leader"):
                raise NotLeader(str(exc)[6:]) from None
            if str(exc).startswith("farm: "):
                raise ValueError(str(exc)[6:]) from None
            raise

    def _eval_and_wait(self, name: str, keys: list[str], argv: list[Any]) -> tuple[Any, int]:
        """EVALSHA + WAIT 1 in one round trip on one connection (WAIT counts that connection's writes). A
        primary without the script (a new one after a failover) has it loaded, and the pair goes again."""
        script = self._scripts[name]
        for _attempt in range(3):
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys), *keys, *argv)
            pipe.execute_command("WAIT", 1, self.acks.timeout_ms())
            reply, acks = pipe.execute(raise_on_error=False)
            if isinstance(reply, redis.exceptions.NoScriptError):
                script.sha = self.client.script_load(script.script)
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acks, Exception):
                raise acks
            self.acks.record(int(acks))
            return reply, int(acks)
        raise redis.ConnectionError(f"script {name} vanished from the primary three times in a row")

    # ------------------------------------------------------------------ renders and tasks

    def create_render(self, render_id: str, spec: dict, tasks: list[dict], priority: int = 0) -> bool:
        """Create the render and its task graph atomically. False (no change) if it already exists."""
        return bool(self._run("create_render", render_id, json.dumps(spec), int(priority), _tasks_arg(tasks)))

    def add_tasks(self, render_id: str, tasks: list[dict]) -> bool:
        """Grow a live render's graph (per-step tiles). Known ids are skipped; a stopped render ignores it."""
        if not tasks:
            return False
        return bool(self._run("add_tasks", render_id, _tasks_arg(tasks)))

    def set_length(self, render_id: str, task_id: str, holder: str, fence: int, spec: dict,
                   tasks: list[dict]) -> str:
        """A 2.5 render's picked length: its spec with it and the rest of its graph, added by the plan
        task's holder. 'ok', or 'stale' when that lease is not the holder's any more."""
        status = self._run("set_length", render_id, task_id, holder, int(fence), json.dumps(spec),
                           int(spec["frames"]), float(spec["predicted_seconds"]), _tasks_arg(tasks))
        return Outcome.STALE if status == Outcome.STALE else Outcome.OK

    def lease(self, worker_id: str, capabilities: list[str], lease_ms: int, seen: bool = False) -> dict | None:
        """Pop the first ready task of the listed capabilities (in that order) and lease it: one Lua call
        whose reply is the whole task. seen: a worker asks (the call marks it live, idle or busy)."""
        if not capabilities:
            return None
        got = self._run("lease", worker_id, int(lease_ms), "1" if seen else "0", *capabilities)
        return self._task(reply_pairs(got[1]), got[0]) if got else None

    def peek_lease(self, worker_id: str, capabilities: list[str], passed: list[str]) -> dict | None:
        """The task lease() would give this worker now, chosen by the same script and rules, with nothing
        leased or moved; the tasks in `passed` (guessed for other workers) are stepped over. What a busy
        worker's prefetch warms its cache for (FarmWorker.Upcoming)."""
        if not capabilities:
            return None
        got = self._run("lease", worker_id, 0, "peek", json.dumps(sorted(passed)), *capabilities)
        return self._task(reply_pairs(got[1]), got[0]) if got else None

    def heartbeat(self, task_id: str, worker_id: str, fence: int, lease_ms: int,
                  progress: dict | None = None) -> str:
        """'ok' (deadline extended), 'stale' (not your lease any more) or 'cancel' (render stopped)."""
        return self.beat(task_id, worker_id, fence, lease_ms, progress)[0]

    def beat(self, task_id: str, worker_id: str, fence: int, lease_ms: int,
             progress: dict | None = None) -> tuple[str, bool]:
        """A worker's heartbeat in one round trip: (heartbeat's status, whether the worker should drain);
        it marks the worker live as well."""
        prog = json.dumps(progress) if progress is not None else ""
        status, drain = self._run("heartbeat", task_id, worker_id, int(fence), int(lease_ms), prog)
        return str(status), drain == "1"

    def complete(self, task_id: str, worker_id: str, fence: int, outputs: dict[str, str], metrics: dict,
                 seen: bool = False) -> str:
        """Commit a result under the lease's fence: 'ok', 'render_ready' (last task) or 'stale'.
        seen: the worker reports it (the same call marks it live and idle)."""
        return self._run("complete", task_id, worker_id, int(fence), json.dumps(outputs), json.dumps(metrics),
                         "1" if seen else "0")

    def complete_and_lease(self, task_id: str, worker_id: str, fence: int, outputs: dict[str, str], metrics: dict,
                           capabilities: list[str], lease_ms: int) -> tuple[str, dict | None]:
        """complete() then lease() for the same worker (both seen), in one Lua call: (complete's status,
        the next task or None)."""
        if not capabilities:
            return self.complete(task_id, worker_id, fence, outputs, metrics, seen=True), None
        done = (task_id, worker_id, int(fence), json.dumps(outputs), json.dumps(metrics), "1")
        status, got = self._run("complete_lease", len(done), *done, worker_id, int(lease_ms), "1", *capabilities)
        return status, self._task(reply_pairs(got[1]), got[0]) if got else None

    def set_policy(self, **fields: str) -> dict[str, str]:
        """Set scheduling policy fields lease.lua reads (dealing, affinity: '0'/'1'; weight:<submitter>);
        '' restores a field's default. Returns the whole policy."""
        return reply_pairs(self._run("set_policy", *(x for kv in fields.items() for x in kv)))

    def fail(self, task_id: str, worker_id: str, fence: int, error: str, retryable: bool = True,
             seen: bool = False, fault: str = "") -> str:
        """'requeued' while attempts remain, else 'failed' (and the render with it); 'stale' if not held.
        seen: the worker reports it (the same call marks it live and idle). fault: the error's class
        (protos.states.Fault); unset, retryable=False means permanent and True unknown."""
        fault = fault or (Fault.UNKNOWN if retryable else Fault.PERMANENT)
        return self._run("fail", task_id, worker_id, int(fence), error, str(fault), "1" if seen else "0")

    def expire_leases(self, now_ms: int | None = None) -> list[str]:
        """Re-queue (or fail, when out of attempts) every task whose lease deadline has passed."""
        return list(self._run("expire_leases", "" if now_ms is None else int(now_ms)))

    def cancel_render(self, render_id: str) -> bool:
        """Stop a render: queued tasks leave the queues, running ones hear 'cancel' on heartbeat."""
        return bool(self._run("cancel_render", render_id))

    def delete_render(self, render_id: str) -> str:
        """Forget a finished render (hash, tasks, events): 'deleted', 'missing', or its live state."""
        return str(self._run("delete_render", render_id))

    def claim_notify(self, render_id: str) -> bool:
        """True once per finished render: the caller sends its webhook (at most once)."""
        return bool(self._run("claim_notify", render_id))

    def set_priority(self, render_id: str, priority: int) -> bool:
        """Record a live render's priority (shown on the dashboard). False if finished/missing."""
        return bool(self._run("set_priority", render_id, int(priority)))

    def retry_render(self, render_id: str) -> str:
        """Run a failed/cancelled render again under its id, keeping its finished tasks: 'retried', or why
        not ('live', 'missing', 'gone' when a blob it needs was collected: render it anew instead)."""
        return str(self._run("retry_render", render_id))

    def requeue_task(self, task_id: str) -> bool:
        """Take a leased task from its worker (its fence goes stale) and queue it again."""
        return bool(self._run("requeue_task", task_id))

    def set_render_state(self, render_id: str, state: str, **fields: Any) -> bool:
        """Move a live render to `state` with extra fields (stage, output, error). False if finished/missing."""
        bad = _RESERVED_RENDER_FIELDS & fields.keys()
        if bad:
            raise ValueError(f"set_render_state cannot set {sorted(bad)}")
        flat = {k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()}
        return bool(self._run("set_render_state", render_id, state, json.dumps(flat)))

    # ------------------------------------------------------------------ events

    def emit(self, render_id: str, event: dict) -> str:
        """Append an event (a "ts" in Redis time is added); returns the stream id."""
        return self._run("emit", render_id, json.dumps(event))

    # ------------------------------------------------------------------ workers

    def register_worker(self, worker_id: str, info: dict, resumed: bool = False, session: str = "",
                        idle: bool = False, refused: str = "") -> None:
        """Record a worker; a fresh start clears a drain mark, a resumed registration keeps it. A new
        session (a new agent process) returns the leases the worker's last process still held; an idle
        agent (it runs no task) returns every lease the farm still has for it (replies it never got).
        `refused`: why the coordinator turned it away (it is shown, and leased nothing)."""
        self._run("register_worker", worker_id, json.dumps(info), "1" if resumed else "0", session,
                  "1" if idle else "0", refused)

    def lose_leases(self, worker_id: str, session: str = "", reason: str = "", task_id: str = "") -> list[str]:
        """Give back, at once and without spending an attempt, the leases of a worker that vanished (of
        one session, or any; one task, or all). Marks the worker lost when that session is its current."""
        reason = reason or f"{worker_id} went away"
        return list(self._run("lose_leases", worker_id, session, reason, task_id))

    def clear_blocklist(self, render_id: str) -> bool:
        """Let the render's blocklisted workers lease its tasks again. False if nothing to clear."""
        return bool(self._run("clear_blocklist", render_id))

    def check_stuck(self, soft_floor_ms: int, soft_factor: float, hard_floor_ms: int,
                    hard_factor: float) -> tuple[list[str], list[str]]:
        """(flagged, cancelled): tasks past their kind's soft limit (flagged once), past the hard one."""
        flagged, cancelled = self._run("check_stuck", int(soft_floor_ms), float(soft_factor),
                                       int(hard_floor_ms), float(hard_factor))
        return list(flagged), list(cancelled)

    def worker_seen(self, worker_id: str, state: str, current_task: str | None) -> None:
        self._run("worker_seen", worker_id, state, current_task or "")

    def worker_pack_sync(self, worker_id: str, progress: dict) -> bool:
        """Record a worker's pack copy progress ({pack: {state, bytes, total}}); False for an unknown worker."""
        return bool(self._run("worker_pack_sync", worker_id, json.dumps(progress)))

    def drain_worker(self, worker_id: str) -> bool:
        """Mark a worker draining (no new task; it exits when its current one ends). False if unknown."""
        return bool(self._run("drain_worker", worker_id))

    def resume_worker(self, worker_id: str) -> bool:
        """Undo a drain while the worker is still there (it keeps serving). False if it is not draining."""
        return bool(self._run("resume_worker", worker_id))

    # ------------------------------------------------------------------ leadership

    def claim_leadership(self, node: str, address: str, lease_ms: int) -> tuple[bool, int, str]:
        """Take or renew the coordinators' lease (lease_ms 0 resigns): (leading, epoch, leader address)."""
        (lead, epoch, leader, _deadline), acks = self._run_acked("leadership", node, address, int(lease_ms))
        if lead and acks == 0 and str(epoch) != self.epoch:
            raise EpochNotReplicated(f"epoch {epoch} is on the primary only (no replica acknowledged it)")
        return bool(lead), int(epoch), str(leader or "")

    # ------------------------------------------------------------------ blobs

    def put_blob_ref(self, sha: str, path: str, size: int) -> None:
        self._run("put_blob_ref", sha, str(path), int(size))

    def forget_workers(self, seen_before_ms: int) -> list[str]:
        """Drop the records of workers not seen since the cutoff that hold no lease; their ids."""
        return [str(w) for w in self._run("forget_workers", int(seen_before_ms)) or []]

    def forget_blob(self, sha: str, created_before_ms: int) -> str | None:
        """Drop a blob's record if it was created before the cutoff; returns its file path to delete."""
        path = self._run("forget_blob", sha, int(created_before_ms))
        return str(path) if path else None
