"""The rules a field of a message from another process obeys (whole numbers, numbers, text, bounded JSON
objects) and the one error they raise. Part of the contract: the worker's records (protos/records.py) and
the coordinator's checks (coordinator/schema.py) state each rule once, here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

MAX_JSON_DEPTH = 8


class SpecError(ValueError):
    """A render that must not be queued, or a message that must not be accepted; the message is the one
    line the user sees."""


def short_repr(value: Any) -> str:
    """A value as an error line quotes it: its repr, cut to 60 characters."""
    return repr(value)[:60]


def parse_object(text: str, what: str, max_bytes: int) -> dict:
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


def integer(low: int, high: int) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(f"{name} {short_repr(value)} is not a whole number")
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise SpecError(f"{name} {short_repr(value)} is not a whole number")
        if low == 0 and value < 0:
            raise SpecError(f"{name} {int(value)} is negative")
        if not low <= int(value) <= high:
            raise SpecError(f"{name} {int(value)} is outside {low}..{high}")
        return int(value)
    return check


def number(low: float, high: float, *, open_low: bool = False) -> Callable[[str, Any], float]:
    def check(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise SpecError(f"{name} {short_repr(value)} is not a finite number")
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
            raise SpecError(f"{name} {short_repr(value)} has characters it may not hold")
        return value
    return check
