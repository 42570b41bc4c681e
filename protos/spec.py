"""The render spec: what a render asks for, as one frozen record with one table of defaults.

Why here: the spec crosses the CLI → coordinator boundary (`farm render / submit / plan` build it,
the gRPC Submit builds it again from the JSON it receives), so it lives in the contract, which both
sides import. It is built and validated once where it enters (`RenderSpec.from_dict`): types and
ranges are checked, unknown fields refused in one line, numbers typed. Nothing rewrites it later;
what the planner decides (the chosen length, tiles, the text encoder) is a separate record
(`coordinator.plan.resolved.Resolved`).

What a value means for a render (multiples of 64, 8k+1 frames, packs the fleet holds) stays in the
planner, which only ever sees specs built here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from protos.fields import SpecError, integer, number, short_repr, text
from protos.fields import parse_object as _parse_object

MAX_SPEC_BYTES = 256 * 1024
MAX_PROMPT_CHARS = 20_000
MAX_SEED = 2**63 - 1
MAX_FRAME_RATE = 240.0
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")  # no ':' (key separator), no spaces, bounded
SHA256 = re.compile(r"[0-9a-f]{64}")
JsonValue = str | int | float | bool | None | list | dict
Rule = Callable[[str, object], object]


def parse_object(text: str, what: str, max_bytes: int = MAX_SPEC_BYTES) -> dict:
    """A JSON object of bounded size and depth (a spec's bound by default), or SpecError."""
    return _parse_object(text, what, max_bytes)


# ------------------------------------------------------------------ field rules (integer, number, text: protos.fields)


def boolean(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"{name} must be true or false")
    return value


def sigmas(name: str, value: object) -> tuple[float, ...]:
    """Strictly decreasing, in (0, 1], ending at 0: what the sampler steps through."""
    if not isinstance(value, list | tuple) or not 2 <= len(value) <= 64:
        raise SpecError(f"{name} must be a list of 2..64 numbers")
    out = tuple(number(0.0, 1.0)(name, v) for v in value)
    if out[-1] != 0.0 or any(b >= a for a, b in zip(out, out[1:], strict=False)) or out[0] <= 0:
        raise SpecError(f"{name} must fall strictly from (0, 1] to 0, e.g. 0.909375,0.725,0.421875,0")
    return out


@dataclass(frozen=True, slots=True)
class ImageCondition:
    """An image that conditions the render at one frame (`blob`: the uploaded image's sha256)."""

    blob: str | None = None
    frame: int | None = None
    strength: float | None = None

    def to_dict(self) -> dict:
        """The JSON form: only the keys given."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def image(name: str, value: object) -> ImageCondition:
    if isinstance(value, ImageCondition):
        value = value.to_dict()
    if not isinstance(value, dict) or set(value) - {"blob", "frame", "strength"}:
        raise SpecError(f"{name} must be {{blob, frame, strength}}")
    blob, frame, strength = value.get("blob"), value.get("frame"), value.get("strength")
    return ImageCondition(
        blob=None if blob is None else text(64, pattern=SHA256)(f"{name} blob", blob),
        frame=None if frame is None else integer(0, 10_000)(f"{name} frame", frame),
        strength=None if strength is None else number(0.0, 1.0)(f"{name} strength", strength))


def exr(name: str, value: object) -> str | bool:
    """Only a yes on the farm (the coordinator writes into its render folder); the client's own folder
    rides along for the client that fetches them."""
    return value if isinstance(value, bool) else text(4096)(name, value)


def scalar(name: str, value: object) -> str | int | float | bool:
    """A field without its own rule: one JSON scalar of bounded size."""
    if isinstance(value, str):
        return text(4096)(name, value)
    if isinstance(value, bool | int) or (isinstance(value, float) and math.isfinite(value)):
        return value
    raise SpecError(f"{name} {short_repr(value)} is not a plain value")


def text_encoder(name: str, value: object) -> str:
    """"pack" (its own tower), a repo id or a folder."""
    value = text(1024)(name, value)
    if not value.strip():
        raise SpecError(f"text_encoder {value[:80]!r} is not a repo id, a folder or 'pack'")
    return value


# ------------------------------------------------------------------ issue #29: EXR colourspace, length range
def seconds_range(name: str, value: object) -> tuple[float, float]:
    """--auto-duration MIN:MAX as [min, max] seconds (the planner checks it against the head's range)."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise SpecError(f"{name} must be [min, max] seconds, e.g. 2:8")
    low, high = (number(0.0, 3600.0, open_low=True)(name, v) for v in value)
    if low > high:
        raise SpecError(f"{name} {low:g}:{high:g} has its minimum above its maximum")
    return low, high


SPEC_FIELDS: dict[str, Rule] = {
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
    "text_encoder": text_encoder,
    "detailing_lora": scalar,
    "detailing_strength": number(0.0, 4.0),
    "priority": integer(-1_000_000, 1_000_000),
    "submitter": text(256),
    "group": text(128, pattern=ID),
    "notify": text(2048, pattern=re.compile(r"https?://\S+")),
}
SPEC_FIELDS |= {"exr_colorspace": text(32), "auto_duration": seconds_range, "hdr": boolean}  # issue #29
SUBMIT_FIELDS = ("submitter", "priority", "group", "notify")  # who and how it queues; stored only when given
RESOLVED_ONLY = ("generation", "predicted_seconds")  # accepted (older clients send them back) and dropped


@dataclass(frozen=True, slots=True)
class RenderSpec:
    """What a render asks for. The field defaults are the one table of defaults."""

    prompt: str = ""
    height: int = 256
    width: int = 384
    frames: int | None = None  # None: a 2.5 pack's DurationHead picks it (plan/length.py), else 25
    frame_rate: float = 24.0
    seed: int = 1
    pack: str = "tiny"
    image: ImageCondition | None = None
    audio: bool = True
    stage2_tiles: str | None = None  # None: one stage-2 task; "auto" | "HxW" | "FxHxW": tiled data parallel
    tile_overlap: int = 5
    stage2_sigmas: tuple[float, ...] | None = None
    temporal_upscalings: int = 0  # DFR rounds (LTX-2.5 packs)
    decode_tiles: str = "auto"  # "auto" | "off" | "F,H,W" pixel tile sizes
    exr: str | bool | None = None  # a folder for EXR frames (on the machine that assembles)
    text_encoder: str | None = None  # "pack" (its own tower), a repo id or a folder
    detailing_lora: str | None = None  # DFR: an IC-LoRA file in the pack, fused into stage 2's DiT
    detailing_strength: float = 0.5
    exr_colorspace: str | None = None  # issue #29: srgb-linear (None) | acescg | acescct (ltx_engine/color.py)
    auto_duration: tuple[float, float] | None = None  # issue #29: the DurationHead's [min, max] seconds
    hdr: bool = False  # issue #29: also an HLG 10-bit HEVC master of the decode (render_hlg.mp4)
    submitter: str | None = None
    priority: int | None = None
    group: str | None = None
    notify: str | None = None

    @classmethod
    def from_dict(cls, raw: Mapping[str, object]) -> RenderSpec:
        """The spec a client sent, checked field by field (None = the default); unknown fields refused."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - names - set(RESOLVED_ONLY))
        if unknown:
            raise SpecError(f"unknown spec field {str(unknown[0])[:60]!r}")
        typed = {key: SPEC_FIELDS.get(key, scalar)(key, value) for key, value in raw.items()
                 if value is not None and key in names}
        return cls(**typed)

    def to_dict(self) -> dict[str, JsonValue]:
        """The JSON form: every asked field (None where left out), the submit fields only when given."""
        out: dict[str, JsonValue] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in SUBMIT_FIELDS and value is None:
                continue
            out[f.name] = json_value(value)
        return out


def json_value(value: object) -> JsonValue:
    """A spec field as JSON holds it (an image as its object, sigmas as a list)."""
    if isinstance(value, ImageCondition):
        return value.to_dict()
    if isinstance(value, tuple):
        return list(value)
    return value if isinstance(value, str | int | float | bool | list | dict) else None


def spec_field_names() -> tuple[str, ...]:
    """The fields a submit may carry (what `farm retry` sends again out of a recorded spec)."""
    return tuple(f.name for f in fields(RenderSpec))
