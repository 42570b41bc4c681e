"""The farm's state vocabulary, written once: render, task and worker states, which render states are
final, and the outcome words the Lua scripts answer with.

Why here: the states are part of the contract between the parts (the coordinator's Lua writes them,
the CLI and the dashboard read them back over gRPC and JSON), as Flamenco keeps its job and task
statuses in its API contract. The Lua cannot import Python, so common.lua keeps its own TERMINAL table;
tests/unit/test_states.py holds every state and outcome the scripts write against this module.

The enums are `str` enums (as arq's `JobStatus(str, Enum)`): a member equals its word, hashes like it
and formats as it, so it goes into Redis, JSON and log lines unchanged and compares with what the
store reads back.
"""

from __future__ import annotations

from enum import StrEnum


class RenderState(StrEnum):
    """A render: queued -> running (its first lease) -> assembling (every task done) -> done,
    or failed / cancelled at any point before."""

    QUEUED = "queued"
    RUNNING = "running"
    ASSEMBLING = "assembling"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TaskState(StrEnum):
    """A task: waiting (deps pending) -> queued -> leased -> done | failed | cancelled."""

    WAITING = "waiting"
    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class WorkerState(StrEnum):
    """A worker as its record says: idle or busy while it calls in, lost when its connection broke,
    drained once it left on a drain, refused when it registered with another project version (it is
    leased nothing). (`draining` is a reading of the drain mark, not a state.)"""

    IDLE = "idle"
    BUSY = "busy"
    LOST = "lost"
    DRAINED = "drained"
    REFUSED = "refused"


# A render in one of these states runs nothing again unless retried; common.lua's TERMINAL is the same set.
TERMINAL: frozenset[RenderState] = frozenset({RenderState.DONE, RenderState.FAILED, RenderState.CANCELLED})
# The ended renders `farm retry` (retry_render.lua) runs again under their id: not a finished one.
RETRYABLE: frozenset[RenderState] = frozenset({RenderState.FAILED, RenderState.CANCELLED})


class Fault(StrEnum):
    """A task error's class, as the worker judges it (worker/faults.py) and fail.lua reads it."""

    PERMANENT = "permanent"  # the task's own (the engine refused its input): every worker would hit it
    TRANSIENT = "transient"  # the worker's (memory, a killed process, I/O, a lost peer): another may succeed
    UNKNOWN = "unknown"  # either: retried, and the same text from a second worker makes it the task's


class Outcome(StrEnum):
    """The words the Lua scripts return and the Python side compares against (the worker protocol's
    StatusReply maps the first six onto farm.proto's Status)."""

    OK = "ok"  # heartbeat, complete, set_length: done as asked
    STALE = "stale"  # the caller's lease is not the current one (a new fence), or its render stopped
    CANCEL = "cancel"  # heartbeat: the render stopped, stop the task
    RENDER_READY = "render_ready"  # complete: the render's last task landed, assemble it
    REQUEUED = "requeued"  # fail: an attempt spent, the task is queued again
    FAILED = "failed"  # fail: out of attempts, the render failed with it
    DELETED = "deleted"  # delete_render: forgotten
    MISSING = "missing"  # delete_render, retry_render: no such render
    RETRIED = "retried"  # retry_render: running again under its id
    LIVE = "live"  # retry_render: the render has not ended, nothing to retry
    GONE = "gone"  # retry_render: a blob its kept tasks need was collected: submit it anew
    FAILS_AGAIN = "fails_again"  # retry_render: it failed on an error every worker would hit
