"""What the planner decides for a render, kept apart from what it asked for. Pure.

Why: the spec (`protos.spec.RenderSpec`) is validated once and never rewritten; validation instead
returns a `Resolved` record (the chosen length and what the DurationHead predicted, the pack's
generation, `auto` tiles made concrete, the text encoder, DFR's shipped clip, the fleet's pack size,
the assembly's reference seconds). A `RenderPlan` holds both and the planner reads it by attribute
(`plan.frames`): a resolved value where the planner decided one, else the asked one, typed as the spec
holds it (tuples, media records). Its `as_dict()` is the one view the render hash stores (the same keys
stored renders always had, JSON values), and `from_stored` reads such a view back typed where it
enters from Redis (the assembler's decode tiles), so every reader of a stored spec keeps working.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from protos.guidance_spec import DISTILLED, GUIDANCE_FIELDS
from protos.spec import (
    ASKED_FIELDS,
    GIVEN_FIELDS,
    RESOLVED_ONLY,
    SUBMIT_FIELDS,
    JsonValue,
    RenderSpec,
    json_value,
)

_ENCODER = ASKED_FIELDS.index("text_encoder") + 1  # the resolved-only keys are stored after it
ASKED_ORDER = (*ASKED_FIELDS[:_ENCODER], *RESOLVED_ONLY, *ASKED_FIELDS[_ENCODER:])  # the spec's asked fields
SUBMIT_ORDER = GIVEN_FIELDS + SUBMIT_FIELDS  # stored only when given (the chunk flags: older views lack them)
GUIDANCE_ORDER = tuple(GUIDANCE_FIELDS)  # a dev recipe's knobs: stored only when given (distilled stores none)
DERIVED_ORDER = ("output_frames", "output_fps", "pack_bytes", "assemble_s")  # stored only once known
DERIVED_ORDER += ("source_audio",)  # retake/extend: the probe found an audio track in the clip


@dataclass(frozen=True, slots=True)
class Resolved:
    """The planner's decisions; None = not decided (the asked value, if any, stands)."""

    generation: str | None = None  # the pack's LTX generation, as the live workers report it
    frames: int | None = None  # the length: asked, the DurationHead's pick, or the default
    predicted_seconds: float | None = None  # what a 2.5 DurationHead predicted when it picked `frames`
    text_encoder: str | None = None  # "pack" or a separate encoder's ref
    stage2_tiles: str | None = None  # "FxHxW" counts (auto made concrete)
    decode_tiles: str | None = None  # "off" or "F,H,W" pixels (auto made concrete)
    output_frames: int | None = None  # DFR: frames the render ships
    output_fps: float | None = None  # DFR: the shipped clip's rate
    pack_bytes: int | None = None  # the pack's weight bytes as its holders report them
    assemble_s: float | None = None  # the assembly's reference seconds (set_render_state.lua reads it)
    source_audio: bool | None = None  # the source clip has an audio track (the media probe's)


RESOLVED_FIELDS = frozenset(f.name for f in fields(Resolved))
SPEC_NAMES = frozenset(f.name for f in fields(RenderSpec))


@dataclass(frozen=True, slots=True)
class RenderPlan:
    """A spec with what the planner resolved for it (resolved wins), read by attribute; `as_dict()` is its
    stored view (JSON values), which the store, the engine's rules and the metadata read. Not a mapping:
    one way to read a plan, so no reader keeps a key the view may not hold."""

    spec: RenderSpec
    resolved: Resolved = field(default_factory=Resolved)

    def _stored(self, key: str) -> JsonValue:
        """One key of the stored view (KeyError: the view does not hold it)."""
        if key in RESOLVED_FIELDS:
            value = getattr(self.resolved, key)
            if value is not None:
                return json_value(value)
            if key in ("generation", "predicted_seconds"):  # resolved only, stored as null until known
                return None
            if key in DERIVED_ORDER:
                raise KeyError(key)
        if key in ASKED_ORDER or (key in SUBMIT_ORDER and getattr(self.spec, key) is not None):
            return json_value(getattr(self.spec, key))
        if key in GUIDANCE_ORDER and self._guided(key):
            return json_value(getattr(self.spec, key))
        raise KeyError(key)

    @classmethod
    def from_stored(cls, stored: Mapping[str, object]) -> RenderPlan:
        """A stored view (the render hash's spec, the length task's params, a plan's `as_dict()`) read back
        typed where it enters from Redis: the asked fields through the spec's own checks, the decided ones
        as the Resolved record (the view keeps one value per key, so a decided field reads alike either way)."""
        spec = RenderSpec.from_dict({k: v for k, v in stored.items() if k in SPEC_NAMES})
        return cls(spec, Resolved(**{k: stored[k] for k in RESOLVED_FIELDS if stored.get(k) is not None}))

    def __getattr__(self, name: str) -> Any:
        """`plan.frames`: the resolved value where the planner decided one, else the spec's typed value (a
        tuple, a media record; not its JSON form). A resolved-only field not decided yet (`generation`,
        `pack_bytes`, `output_frames` ...) is None, as is a guidance knob left out: None always means "not
        asked, not decided", so no reader restates a default (the spec's fields hold them)."""
        if name in RESOLVED_FIELDS:
            value = getattr(self.resolved, name)
            if value is not None or name not in SPEC_NAMES:
                return value
        if name in SPEC_NAMES:
            return getattr(self.spec, name)
        raise AttributeError(f"{type(self).__name__!r} has no field {name!r}")

    def _guided(self, key: str) -> bool:
        value = getattr(self.spec, key)
        return value is not None and not (key == "pipeline" and value == DISTILLED)

    def _keys(self) -> Iterator[str]:
        """The stored view's keys, in its order."""
        yield from ASKED_ORDER
        yield from (k for k in SUBMIT_ORDER if getattr(self.spec, k) is not None)
        yield from (k for k in GUIDANCE_ORDER if self._guided(k))
        yield from (k for k in DERIVED_ORDER if getattr(self.resolved, k) is not None)

    def resolve(self, **decided: JsonValue) -> RenderPlan:
        """A new plan with more decided (the spec is untouched)."""
        return replace(self, resolved=replace(self.resolved, **decided))

    def with_spec(self, spec: RenderSpec) -> RenderPlan:
        """The same decisions for another spec (the length probe's)."""
        return replace(self, spec=spec)

    def with_asked(self, **asked: object) -> RenderPlan:
        """The same decisions with some asked fields changed: a stage's view of the render (DFR's stages at
        half the size, the negative prompt's text key), never a render of its own."""
        return replace(self, spec=replace(self.spec, **asked))

    def as_dict(self) -> dict[str, JsonValue]:
        """The stored view: what the render hash, the metadata JSON and every reader see."""
        return {key: self._stored(key) for key in self._keys()}

