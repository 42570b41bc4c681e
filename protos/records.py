"""Typed records of what a worker tells the coordinator: its registration (`WorkerCapabilities`) and
where its running task is (`Progress`). One definition of their fields and rules: the worker builds
them, the coordinator parses them where they enter (coordinator/api/worker_servicer.py, through
coordinator/schema.py) and refuses a message that breaks a rule with a SpecError naming the field.

The wire is unchanged (JSON in the proto's `capabilities_json` / `progress_json`), and so is what the
coordinator stores: `to_dict` gives back the object the worker sent, its keys in the order sent. Fields
without a rule (os, chip, mlx_version, pack_features, the lease queues `capabilities`, ...) ride along
in `other`, shown as sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from protos.fields import SpecError, integer, parse_object, text

JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
MAX_CAPABILITIES_BYTES = 1 << 20
MAX_SMALL_OBJECT_BYTES = 64 * 1024  # progress and metrics: shown and summed, never planned with
MAX_BYTES = 1 << 50
MAX_NAMES = 1024


def _names(name: str, value: Any, limit: int = MAX_NAMES) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > limit or not all(isinstance(v, str) and len(v) <= 1024
                                                                     for v in value):
        raise SpecError(f"capability {name} must be a list of names")
    return tuple(value)


def _mapping(name: str, value: Any, check: Callable[[str, Any], Any]) -> dict:
    if not isinstance(value, dict) or len(value) > 1024:
        raise SpecError(f"capability {name} must be an object")
    return {key: check(f"capability {name}[{str(key)[:40]!r}]", item) for key, item in value.items()}


def _as_sent(name: str, value: Any) -> Any:
    return value


# The rule of each typed registration field (checked only when the worker sends the field).
CAPABILITY_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    "packs": _names,
    "kinds": _names,
    "memory_bytes": integer(0, MAX_BYTES),
    "pack_generation": lambda n, v: _mapping(n, v, text(32)),
    "pack_components": lambda n, v: _mapping(n, v, _names),
    "pack_bytes": lambda n, v: _mapping(n, v, integer(0, MAX_BYTES)),
    "text_encoders": lambda n, v: _mapping(n, v, integer(0, MAX_BYTES)),
    "pack_problems": lambda n, v: _mapping(n, v, _as_sent),
}


def _plain(value: Any) -> JsonValue:
    """A field value as JSON writes it (tuples back to lists, inside mappings too)."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _in_order(sent: dict[str, JsonValue], order: tuple[str, ...]) -> dict[str, JsonValue]:
    """The keys in the order the sender wrote them (then any it did not), so the JSON is what it sent."""
    keys = [k for k in order if k in sent] + [k for k in sent if k not in order]
    return {key: sent[key] for key in keys}


@dataclass(frozen=True)
class WorkerCapabilities:
    """A worker's registration: the packs, task kinds and memory the scheduler and planner read, typed;
    the rest in `other`. None: the worker did not send the field."""

    packs: tuple[str, ...] | None = None
    kinds: tuple[str, ...] | None = None
    memory_bytes: int | None = None
    pack_generation: Mapping[str, str] | None = None
    pack_components: Mapping[str, tuple[str, ...]] | None = None
    pack_bytes: Mapping[str, int] | None = None
    text_encoders: Mapping[str, int] | None = None
    pack_problems: Mapping[str, JsonValue] | None = None
    other: Mapping[str, JsonValue] = field(default_factory=dict)
    order: tuple[str, ...] = field(default=(), compare=False, repr=False)  # keys as sent (to_dict keeps it)

    @classmethod
    def from_dict(cls, info: Mapping[str, Any]) -> WorkerCapabilities:
        """Each typed field checked by its rule (SpecError names the first that breaks it)."""
        typed = {key: rule(key, info[key]) for key, rule in CAPABILITY_FIELDS.items() if key in info}
        other = {key: value for key, value in info.items() if key not in CAPABILITY_FIELDS}
        return cls(**typed, other=other, order=tuple(info))

    @classmethod
    def from_json(cls, text_json: str) -> WorkerCapabilities:
        """What the coordinator reads from `capabilities_json`: a bounded JSON object, then its fields."""
        return cls.from_dict(parse_object(text_json, "capabilities_json", MAX_CAPABILITIES_BYTES))

    @property
    def lease_queues(self) -> JsonValue:
        """The ready queues the worker asked to serve (`capabilities`), as sent; None when it did not say."""
        return self.other.get("capabilities")

    def to_dict(self) -> dict[str, JsonValue]:
        """The registration as the worker sent it: what the coordinator stores and the scheduler reads."""
        sent = {f.name: _plain(getattr(self, f.name)) for f in fields(self)
                if f.name in CAPABILITY_FIELDS and getattr(self, f.name) is not None}
        sent.update(self.other)
        return _in_order(sent, self.order)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_PROGRESS_TYPES: dict[str, Callable[[Any], bool]] = {
    "step": _whole, "total": _whole, "phase": lambda v: isinstance(v, str),
}


@dataclass(frozen=True)
class Progress:
    """Where a running task is, sent with each heartbeat: `step` of `total`, or a `phase` ("run":
    computing, not fetching). Shown on the dashboard, never planned with, so only its size and shape
    are rules; a field of another type, or any other field, rides along in `other` as sent."""

    step: int | None = None
    total: int | None = None
    phase: str | None = None
    other: Mapping[str, JsonValue] = field(default_factory=dict)
    order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Progress:
        """The typed fields that have their type; everything else as sent (no new refusals)."""
        known = {k: v for k, v in values.items() if k in _PROGRESS_TYPES and _PROGRESS_TYPES[k](v)}
        other = {k: v for k, v in values.items() if k not in known}
        return cls(**known, other=other, order=tuple(values))

    @classmethod
    def from_json(cls, text_json: str, what: str = "progress_json") -> Progress:
        """What the coordinator reads from `progress_json`: a small JSON object of bounded depth."""
        return cls.from_dict(parse_object(text_json, what, MAX_SMALL_OBJECT_BYTES))

    def to_dict(self) -> dict[str, JsonValue]:
        """The report as sent: what the coordinator stores on the task and the dashboard shows."""
        sent: dict[str, JsonValue] = {k: v for k in _PROGRESS_TYPES if (v := getattr(self, k)) is not None}
        sent.update(self.other)
        return _in_order(sent, self.order)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())
