"""The typed schema of every message that enters the coordinator from another process: the render
spec (Submit), a worker's registration (capabilities), its progress and metrics, and the ids that
name Redis keys. Checked where each enters, so what cannot render is refused at submit in one line
and nothing a client sends reaches Redis or the planner with the wrong type.

Types and ranges live here; what a value means for a render (multiples of 64, 8k+1 frames, packs the
fleet holds) stays in the planner, which only ever sees specs that passed `check_spec`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from coordinator.plan.graph import SpecError

MAX_SPEC_BYTES = 256 * 1024
MAX_JSON_DEPTH = 8
MAX_PROMPT_CHARS = 20_000
MAX_SEED = 2**63 - 1
MAX_FRAME_RATE = 240.0
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")  # no ':' (key separator), no spaces, bounded
TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,255}")
SHA256 = re.compile(r"[0-9a-f]{64}")


def _line(value: Any) -> str:
    return repr(value)[:60]


def parse_object(text: str, what: str, max_bytes: int = MAX_SPEC_BYTES) -> dict:
    """A JSON object of bounded size and depth, or SpecError (never RecursionError)."""
    if len(text) > max_bytes:
        raise SpecError(f"{what} is {len(text)} bytes; at most {max_bytes} are accepted")
    try:
        value = json.loads(text) if text else {}
    except (ValueError, RecursionError) as exc:
        raise SpecError(f"{what} is not valid JSON: {str(exc).splitlines()[0][:120]}") from None
    if not isinstance(value, dict):
        raise SpecError(f"{what} must be a JSON object")
    if _depth(value) > MAX_JSON_DEPTH:
        raise SpecError(f"{what} is nested more than {MAX_JSON_DEPTH} deep")
    return value


def _depth(value: Any, level: int = 1) -> int:
    if level > MAX_JSON_DEPTH:
        return level
    if isinstance(value, dict):
        return max([_depth(v, level + 1) for v in value.values()] or [level])
    if isinstance(value, list):
        return max([_depth(v, level + 1) for v in value] or [level])
    return level


# ------------------------------------------------------------------ field rules


def integer(low: int, high: int) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(f"{name} {_line(value)} is not a whole number")
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise SpecError(f"{name} {_line(value)} is not a whole number")
        if low == 0 and value < 0:
            raise SpecError(f"{name} {int(value)} is negative")
        if not low <= int(value) <= high:
            raise SpecError(f"{name} {int(value)} is outside {low}..{high}")
        return int(value)
    return check


def number(low: float, high: float, *, open_low: bool = False) -> Callable[[str, Any], float]:
    def check(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise SpecError(f"{name} {_line(value)} is not a finite number")
        if value < low or value > high or (open_low and value == low):
            raise SpecError(f"{name} {value} is outside {'(' if open_low else '['}{low}, {high}]")
        return float(value)
    return check


def text(max_chars: int, *, pattern: re.Pattern | None = None) -> Callable[[str, Any], str]:
    def check(name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise SpecError(f"{name} must be text, not {type(value).__name__}")
        if len(value) > max_chars:
            raise SpecError(f"{name} is {len(value)} characters; at most {max_chars}")
        if "\x00" in value or (pattern is not None and not pattern.fullmatch(value)):
            raise SpecError(f"{name} {_line(value)} has characters it may not hold")
        return value
    return check


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
    raise SpecError(f"{name} {_line(value)} is not a plain value")


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
