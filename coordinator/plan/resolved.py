"""What the planner decides for a render, kept apart from what it asked for. Pure.

Why: the spec (`protos.spec.RenderSpec`) is validated once and never rewritten; validation instead
returns a `Resolved` record (the chosen length and what the DurationHead predicted, the pack's
generation, `auto` tiles made concrete, the text encoder, DFR's shipped clip, the fleet's pack size,
the assembly's reference seconds). A `RenderPlan` holds both and reads as one mapping: a resolved
value where the planner decided one, else the asked one. That mapping is what the pure planning
functions read, and its `as_dict()` is the one view the render hash stores (the same keys stored
renders always had), so every reader of a stored spec keeps working.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace

from protos.guidance_spec import DISTILLED, GUIDANCE_FIELDS
from protos.spec import JsonValue, RenderSpec, json_value

ASKED_ORDER = ("prompt", "height", "width", "frames", "frame_rate", "seed", "pack", "images", "num_generated_keyframes",
               "audio",
               "stage2_tiles", "tile_overlap", "stage2_sigmas", "temporal_upscalings", "decode_tiles", "exr",
               "text_encoder", "generation", "predicted_seconds", "detailing_lora", "detailing_strength",
               "loras", "lora_mode")
ASKED_ORDER += ("sparse_attention", "compute_dtype")  # issue #26: per-render forward settings
ASKED_ORDER += ("exr_colorspace", "auto_duration", "hdr")  # issue #29: EXR colourspace, the head's length range
ASKED_ORDER += ("video_decoder",)  # issue #29: conv | diffusion
ASKED_ORDER += ("dfr", "spatial_upscalings")  # issue #29: DFR's base path and spatial epilogue
ASKED_ORDER += ("audio_input", "source_video", "encode_tiles")  # issue #24: media in (protos/media_spec.py)
ASKED_ORDER += ("control_video", "ic_lora", "dub_video")  # issue #24: IC-LoRA control, Dub-It
ASKED_ORDER += ("retake", "extend")  # issue #24 retake/extend (protos/media_spec.py)
ASKED_ORDER += ("hdr_ic_lora",)  # issue #29: the HDR IC-LoRA render's SDR clip
ASKED_ORDER += ("stage1_parallel",)  # issue #25: sequence-parallel stage 1's degree (auto | K)
SUBMIT_ORDER = ("submitter", "priority", "group", "notify")
GUIDANCE_ORDER = tuple(GUIDANCE_FIELDS)  # a dev recipe's knobs: stored only when given (distilled stores none)
DERIVED_ORDER = ("output_frames", "output_fps", "pack_bytes", "assemble_s")  # stored only once known
DERIVED_ORDER += ("source_audio",)  # issue #24 retake/extend: the probe found an audio track in the clip


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
    source_audio: bool | None = None  # issue #24: the source clip has an audio track (the media probe's)


RESOLVED_FIELDS = frozenset(f.name for f in fields(Resolved))


@dataclass(frozen=True, slots=True)
class RenderPlan(Mapping[str, JsonValue]):
    """A spec with what the planner resolved for it, read as one mapping (resolved wins)."""

    spec: RenderSpec
    resolved: Resolved = field(default_factory=Resolved)

    def __getitem__(self, key: str) -> JsonValue:
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

    def _guided(self, key: str) -> bool:
        value = getattr(self.spec, key)
        return value is not None and not (key == "pipeline" and value == DISTILLED)

    def __iter__(self) -> Iterator[str]:
        yield from ASKED_ORDER
        yield from (k for k in SUBMIT_ORDER if getattr(self.spec, k) is not None)
        yield from (k for k in GUIDANCE_ORDER if self._guided(k))
        yield from (k for k in DERIVED_ORDER if getattr(self.resolved, k) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def resolve(self, **decided: JsonValue) -> RenderPlan:
        """A new plan with more decided (the spec is untouched)."""
        return replace(self, resolved=replace(self.resolved, **decided))

    def with_spec(self, spec: RenderSpec) -> RenderPlan:
        """The same decisions for another spec (the length probe's)."""
        return replace(self, spec=spec)

    def as_dict(self) -> dict[str, JsonValue]:
        """The stored view: what the render hash, the metadata JSON and every reader see."""
        return {key: self[key] for key in self}

