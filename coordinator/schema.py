"""The typed schema of the worker messages that enter the coordinator from another process: a
worker's registration (capabilities), its progress and metrics, and the ids that name Redis keys.
Checked where each enters, so nothing a worker sends reaches Redis or the planner with the wrong type.
The render spec's rules live with the spec record (`protos/spec.py`); the field rules are shared.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from protos.spec import ID, SpecError, integer, parse_object, text

TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,255}")


# ------------------------------------------------------------------ worker messages


def check_id(kind: str, value: str, *, task: bool = False) -> str:
    """A render/worker/task id that is safe as part of a Redis key."""
    if not (TASK_ID if task else ID).fullmatch(value or ""):
        raise SpecError(f"{kind} {value[:60]!r} is not an id (letters, digits, . _ @ + -; "
                        f"at most {256 if task else 128})")
    return value


def _str_list(name: str, value: Any, limit: int = 1024) -> list[str]:
    if not isinstance(value, list) or len(value) > limit or not all(isinstance(v, str) and len(v) <= 1024
                                                                     for v in value):
        raise SpecError(f"capability {name} must be a list of names")
    return value


def _mapping(name: str, value: Any, check: Callable[[str, Any], Any]) -> dict:
    if not isinstance(value, dict) or len(value) > 1024:
        raise SpecError(f"capability {name} must be an object")
    for key, item in value.items():
        check(f"capability {name}[{str(key)[:40]!r}]", item)
    return value


CAPABILITY_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    "packs": _str_list,
    "kinds": _str_list,
    "memory_bytes": integer(0, 1 << 50),
    "pack_generation": lambda n, v: _mapping(n, v, text(32)),
    "pack_components": lambda n, v: _mapping(n, v, _str_list),
    "pack_bytes": lambda n, v: _mapping(n, v, integer(0, 1 << 50)),
    "text_encoders": lambda n, v: _mapping(n, v, integer(0, 1 << 50)),
    "pack_problems": lambda n, v: _mapping(n, v, lambda n2, v2: v2),
}


def check_capabilities(text_json: str) -> dict:
    """A worker's registration: typed where the scheduler and planner read it."""
    info = parse_object(text_json, "capabilities_json", 1 << 20)
    for key, rule in CAPABILITY_FIELDS.items():
        if key in info:
            rule(key, info[key])
    return info


def check_small_object(text_json: str, what: str, max_bytes: int = 64 * 1024) -> dict:
    """Progress and metrics: a small JSON object (shown, summed, never planned with)."""
    return parse_object(text_json, what, max_bytes)
