"""The `stage1_parallel` spec field: "auto" (the default: the degree chosen at lease time
from the idle workers) or K in 1..8 (at most K workers; 1 = off). A K above the live workers is no
error: the lease falls back to the workers it finds."""

from __future__ import annotations

from typing import Any

from protos.fields import SpecError, short_repr

AUTO, MAX_DEGREE = "auto", 8


def stage1_parallel(name: str, value: Any) -> str:
    """ "auto" or a whole number 1..8, kept as text ("auto", "1" .. "8")."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    try:
        k = int(value) if not isinstance(value, bool) and str(value).strip().isdigit() else None
    except (TypeError, ValueError):
        k = None
    if k is None or not 1 <= k <= MAX_DEGREE:
        raise SpecError(
            f"{name} {short_repr(value)} must be auto or a whole number 1..{MAX_DEGREE} (1 = off)"
        )
    return str(k)


def requested_degree(value: str | None) -> int | None:
    """None for auto, else K."""
    return None if value in (None, AUTO) else int(value)
