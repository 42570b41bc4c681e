"""The typed schema of every message that enters the coordinator from another process: the render
spec (Submit), a worker's registration (capabilities), its progress and metrics, and the ids that
name Redis keys. Checked where each enters, so what cannot render is refused at submit in one line
and nothing a client sends reaches Redis or the planner with the wrong type.

Types and ranges live here; what a value means for a render (multiples of 64, 8k+1 frames, packs the
fleet holds) stays in the planner, which only ever sees specs that passed `check_spec`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from protos.fields import SpecError, integer, number, short_repr, text
from protos.fields import parse_object as _parse_object
from protos.records import MAX_SMALL_OBJECT_BYTES, Progress, WorkerCapabilities

MAX_SPEC_BYTES = 256 * 1024
MAX_PROMPT_CHARS = 20_000
MAX_SEED = 2**63 - 1
MAX_FRAME_RATE = 240.0
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")  # no ':' (key separator), no spaces, bounded
TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,255}")
SHA256 = re.compile(r"[0-9a-f]{64}")


def parse_object(text: str, what: str, max_bytes: int = MAX_SPEC_BYTES) -> dict:
    """A JSON object of bounded size and depth, or SpecError (never RecursionError)."""
    return _parse_object(text, what, max_bytes)


# ------------------------------------------------------------------ field rules (integer, number, text: protos.fields)


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"{name} must be true or false")
    return value


def sigmas(name: str, value: Any) -> list[float]:
    """Strictly decreasing, in (0, 1], ending at 0: what the sampler steps through."""
    if not isinstance(value, list) or not 2 <= len(value) <= 64:
        raise SpecError(f"{name} must be a list of 2..64 numbers")
    out = [number(0.0, 1.0)(name, v) for v in value]
    if out[-1] != 0.0 or any(b >= a for a, b in zip(out, out[1:], strict=False)) or out[0] <= 0:
        raise SpecError(f"{name} must fall strictly from (0, 1] to 0, e.g. 0.909375,0.725,0.421875,0")
    return out


def image(name: str, value: Any) -> dict:
    if not isinstance(value, dict) or set(value) - {"blob", "frame", "strength"}:
        raise SpecError(f"{name} must be {{blob, frame, strength}}")
    out = dict(value)
    if "blob" in out:
        out["blob"] = text(64, pattern=SHA256)(f"{name} blob", out["blob"])
    if "frame" in out:
        out["frame"] = integer(0, 10_000)(f"{name} frame", out["frame"])
    if "strength" in out:
        out["strength"] = number(0.0, 1.0)(f"{name} strength", out["strength"])
    return out


def exr(name: str, value: Any) -> Any:
    """Only a yes on the farm (the coordinator writes into its render folder); the client's own folder
    rides along for the client that fetches them."""
    return value if isinstance(value, bool) else text(4096)(name, value)


def scalar(name: str, value: Any) -> Any:
    """A field without its own rule: one JSON scalar of bounded size."""
    if isinstance(value, str):
        return text(4096)(name, value)
    if isinstance(value, bool | int) or (isinstance(value, float) and math.isfinite(value)):
        return value
    raise SpecError(f"{name} {short_repr(value)} is not a plain value")


SPEC_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    "prompt": text(MAX_PROMPT_CHARS),
    "height": integer(1, 1 << 16),
    "width": integer(1, 1 << 16),
    "frames": integer(1, 1 << 16),
    "frame_rate": number(0.0, MAX_FRAME_RATE, open_low=True),
    "seed": integer(0, MAX_SEED),
    "pack": text(256, pattern=re.compile(r"[^\s:][^\x00-\x1f]*")),
    "image": image,
    "audio": boolean,
    "stage2_tiles": text(32),
    "tile_overlap": integer(0, 64),
    "stage2_sigmas": sigmas,
    "temporal_upscalings": integer(0, 4),
    "decode_tiles": text(64),
    "exr": exr,
    "text_encoder": text(1024),
    "priority": integer(-1_000_000, 1_000_000),
    "submitter": text(256),
    "group": text(128, pattern=ID),
    "notify": text(2048, pattern=re.compile(r"https?://\S+")),
    "detailing_strength": number(0.0, 4.0),
}


def check_spec(raw: dict, known: set[str]) -> dict:
    """Each field of a submitted spec with its type and range (None = the default); unknown fields
    refused. `known`: the planner's field names (its DEFAULTS and the submit-only extras)."""
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SpecError(f"unknown spec field {str(unknown[0])[:60]!r}")
    return {key: None if value is None else SPEC_FIELDS.get(key, scalar)(key, value) for key, value in raw.items()}


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
