"""Checking a worker's result before it may commit: every output the planner expects is there, was
uploaded, and has the dtype and shape of params["expect"]. A refused result re-queues the task, so one
bad worker cannot poison a render. Split from scheduler.py (the size rule); no behaviour change.
"""

from __future__ import annotations

import json
from typing import Any

from coordinator.state.blobs import BlobError, BlobStore


def as_dict(value: Any) -> dict:
    """Store fields may come back decoded or as JSON text; accept both."""
    if value is None or value == "":
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, (str, bytes)):
        decoded = json.loads(value)
        return decoded if isinstance(decoded, dict) else {}
    return dict(value)


def shape_matches(expected: list | tuple, actual: tuple[int, ...]) -> bool:
    """Exact shape match; None or -1 in the expectation matches any size on that axis."""
    if len(expected) != len(actual):
        return False
    return all(e is None or int(e) == -1 or int(e) == a for e, a in zip(expected, actual, strict=True))


def check_outputs(blobs: BlobStore, expect: dict, outputs: dict[str, str]) -> str | None:
    """Why these outputs must be refused, or None when they match the task's params["expect"]."""
    missing = sorted(set(expect) - set(outputs))
    if missing:
        return f"missing outputs: {', '.join(missing)}"
    for name, sha in sorted(outputs.items()):
        if not blobs.has(sha):
            return f"output {name}: blob {str(sha)[:12]} was never uploaded"
        if name not in expect:
            continue
        try:
            dtype, shape, _ = blobs.header(sha)
        except BlobError as exc:
            return f"output {name}: {exc}"
        want = expect[name]
        if want.get("dtype") and dtype != want["dtype"]:
            return f"output {name}: dtype {dtype}, expected {want['dtype']}"
        # No shape, or [] (the planner's "dtype only"), leaves the shape unchecked.
        if want.get("shape") and not shape_matches(want["shape"], shape):
            return f"output {name}: shape {list(shape)}, expected {list(want['shape'])}"
    return None
