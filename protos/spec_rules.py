"""The rules of the render spec's fields (what `RenderSpec.from_dict` accepts, field by field).

Why apart from `protos/spec.py`: the record there declares each field once, with its rule and flags
(protos/flags.py); the rules that take more than a line (images, LoRAs, sigmas, ranges) are here, in
the contract both sides import.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields

from protos.fields import SpecError, integer, number, short_repr, text

SHA256 = re.compile(r"[0-9a-f]{64}")
Rule = Callable[[str, object], object]


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
    """An image that conditions the render at one frame (`blob`: the uploaded image's sha256). `frame`: a
    pixel index, negative from the end, or "last"; `binding`: replace | guide | auto (None: auto);
    `crf`: the H.264 round trip's CRF before encoding (None: the pack generation's default, 0: none)."""

    blob: str | None = None
    frame: int | str | None = None
    strength: float | None = None
    binding: str | None = None
    crf: int | None = None

    def to_dict(self) -> dict:
        """The JSON form: only the keys given."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


MAX_IMAGES = 16  # keyframes of one render: each is two encode tasks and its guide tokens in every stage
MAX_CRF = 51  # libx264's range
IMAGE_KEYS = ("blob", "frame", "strength", "binding", "crf")
IMAGE_BINDINGS = ("replace", "guide", "auto")


def _image_frame(name: str, value: object) -> int | str:
    if value == "last":
        return "last"
    return integer(-10_000, 10_000)(f"{name} frame", value)


def image(name: str, value: object) -> ImageCondition:
    if isinstance(value, ImageCondition):
        value = value.to_dict()
    if not isinstance(value, dict) or set(value) - set(IMAGE_KEYS):
        raise SpecError(f"{name} must be {{{', '.join(IMAGE_KEYS)}}}")
    blob, frame, strength = value.get("blob"), value.get("frame"), value.get("strength")
    binding, crf = value.get("binding"), value.get("crf")
    if binding is not None and binding not in IMAGE_BINDINGS:
        raise SpecError(f"{name} binding {short_repr(binding)} is not one of {', '.join(IMAGE_BINDINGS)}")
    return ImageCondition(
        blob=None if blob is None else text(64, pattern=SHA256)(f"{name} blob", blob),
        frame=None if frame is None else _image_frame(name, frame),
        strength=None if strength is None else number(0.0, 1.0)(f"{name} strength", strength),
        binding=binding,
        crf=None if crf is None else integer(0, MAX_CRF)(f"{name} crf", crf))


def images(name: str, value: object) -> tuple[ImageCondition, ...]:
    """Several images / keyframes, in order (image 1, image 2, ... in the one-line refusals)."""
    if not isinstance(value, list | tuple):
        raise SpecError(f"{name} must be a list of images")
    if len(value) > MAX_IMAGES:
        raise SpecError(f"{len(value)} images: at most {MAX_IMAGES} per render")
    return tuple(image(f"image {i + 1}", one) for i, one in enumerate(value))


# ------------------------------------------------------------------ user LoRAs

MAX_LORAS = 8  # LoRAs in one set (ltx_engine.lora.lora.lora.MAX_LORAS holds the engine to the same number)
MAX_LORA_STRENGTH = 8.0  # |strength| above this is refused (upstream's CLI takes any float; past 2 is noise)
LORA_MODES = ("fused", "unfused")  # ltx_engine.lora.lora.lora.LORA_MODES


@dataclass(frozen=True, slots=True)
class LoraRef:
    """One user LoRA of a render: exactly one of `blob` (the sha256 of a file uploaded from the client,
    or fetched from the hub by it) and `file` (a .safetensors name in the pack folder); `repo` records
    the hub REPO/FILE a blob came from and `name` the client's file name, for the lines that name it."""

    strength: float
    blob: str | None = None
    file: str | None = None
    repo: str | None = None
    name: str | None = None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def _lora(name: str, value: object) -> LoraRef:
    if isinstance(value, LoraRef):
        value = value.to_dict()
    if not isinstance(value, dict) or set(value) - {"strength", "blob", "file", "repo", "name"}:
        raise SpecError(f"{name} must be {{strength, blob | file, repo, name}}")
    if (value.get("blob") is None) == (value.get("file") is None):
        raise SpecError(f"{name} names neither or both of an uploaded blob and a pack file")
    strength = value.get("strength")
    if not isinstance(strength, int | float) or isinstance(strength, bool) or not math.isfinite(strength):
        raise SpecError(f"{name} strength {short_repr(strength)} is not a finite number")
    if abs(strength) > MAX_LORA_STRENGTH:
        raise SpecError(f"{name} strength {strength} is outside [-{MAX_LORA_STRENGTH:g}, {MAX_LORA_STRENGTH:g}]")
    file = value.get("file")
    if file is not None and (not isinstance(file, str) or "/" in file or "\\" in file or file.startswith(".")
                             or not file.endswith(".safetensors") or len(file) > 255):
        raise SpecError(f"{name} file {short_repr(file)} is not a .safetensors file name in the pack folder")
    return LoraRef(strength=float(strength),
                   blob=None if value.get("blob") is None else text(64, pattern=SHA256)(f"{name} blob", value["blob"]),
                   file=file, repo=None if value.get("repo") is None else text(512)(f"{name} repo", value["repo"]),
                   name=None if value.get("name") is None else text(255)(f"{name} name", value["name"]))


def loras(name: str, value: object) -> tuple[LoraRef, ...]:
    """At most MAX_LORAS LoRAs, each with a finite strength; the set's order is kept (it is the order
    the float32 sum of their updates runs in)."""
    if not isinstance(value, list | tuple):
        raise SpecError(f"{name} must be a list of LoRAs")
    if len(value) > MAX_LORAS:
        raise SpecError(f"{len(value)} LoRAs in one render; at most {MAX_LORAS}")
    return tuple(_lora(f"LoRA {_named(v) or i + 1}", v) for i, v in enumerate(value))


def _named(value: object) -> str | None:
    """The name a LoRA's refusal gives it: its client file, hub repo or pack file (bounded)."""
    if not isinstance(value, dict):
        return None
    name = value.get("name") or value.get("repo") or value.get("file")
    return name[:120] if isinstance(name, str) else None


def lora_mode(name: str, value: object) -> str:
    if value not in LORA_MODES:
        raise SpecError(f"{name} {short_repr(value)} is not one of {', '.join(LORA_MODES)}")
    return str(value)


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


# ------------------------------------------------------------------ per-render forward settings
def taus(name: str, value: object) -> tuple[float, ...]:
    """Sparse stage-2 attention: one finite tau per stage-2 step (the planner checks the count)."""
    if not isinstance(value, list | tuple) or not 1 <= len(value) <= 64:
        raise SpecError(f"{name} must be a list of 1..64 taus, one per stage-2 step, e.g. 1.0,1.25,1.5")
    return tuple(number(-1e6, 1e6)(name, v) for v in value)


# ------------------------------------------------------------------ EXR colourspace, length range
def seconds_range(name: str, value: object) -> tuple[float, float]:
    """--auto-duration MIN:MAX as [min, max] seconds (the planner checks it against the head's range)."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise SpecError(f"{name} must be [min, max] seconds, e.g. 2:8")
    low, high = (number(0.0, 3600.0, open_low=True)(name, v) for v in value)
    if low > high:
        raise SpecError(f"{name} {low:g}:{high:g} has its minimum above its maximum")
    return low, high


VIDEO_DECODERS = ("conv", "diffusion")  # the conv VAE decoder, or LTX-2.5's vae_decoder_av


def video_decoder(name: str, value: object) -> str:
    if value not in VIDEO_DECODERS:
        raise SpecError(f"{name} {str(value)[:40]!r}: give conv or diffusion")
    return str(value)


def step_cache(name: str, value: object) -> float:
    """The step cache's threshold (ltx_engine/rules/step_cache.py): a finite number >= 0; 0 never skips."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise SpecError(f"--step-cache {short_repr(value)}: the threshold must be a finite number >= 0 "
                        "(the MLX port's default is 0.5)")
    return float(value)
