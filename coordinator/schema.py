"""The typed schema of the worker messages that enter the coordinator from another process: a
worker's registration (capabilities), its progress and metrics, and the ids that name Redis keys.
Checked where each enters, so nothing a worker sends reaches Redis or the planner with the wrong type.
The render spec's rules live with the spec record (`protos/spec.py`); the field rules are shared.
"""

from __future__ import annotations

import re

from protos.fields import SpecError, parse_object
from protos.records import MAX_SMALL_OBJECT_BYTES, Progress, WorkerCapabilities
from protos.spec import ID

TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,255}")


# ------------------------------------------------------------------ worker messages


def check_id(kind: str, value: str, *, task: bool = False) -> str:
    """A render/worker/task id that is safe as part of a Redis key."""
    if not (TASK_ID if task else ID).fullmatch(value or ""):
        raise SpecError(f"{kind} {value[:60]!r} is not an id (letters, digits, . _ @ + -; "
                        f"at most {256 if task else 128})")
    return value


def check_capabilities(text_json: str) -> WorkerCapabilities:
    """A worker's registration (protos.records): typed where the scheduler and planner read it."""
    return WorkerCapabilities.from_json(text_json)


def check_progress(text_json: str) -> Progress:
    """A heartbeat's progress (protos.records): a small JSON object, shown, never planned with."""
    return Progress.from_json(text_json, "progress_json")


def check_small_object(text_json: str, what: str, max_bytes: int = MAX_SMALL_OBJECT_BYTES) -> dict:
    """Metrics and pack copy reports: a small JSON object (shown, summed, never planned with)."""
    return parse_object(text_json, what, max_bytes)
