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
from protos.guidance_spec import GUIDANCE_FIELDS, check_guidance
from protos.media_spec import (
    MEDIA_FIELDS,
    MEDIA_RECORDS,
    AudioInput,
    ControlVideo,
    Extend,
    HdrIcLora,
    IcLora,
    Retake,
    SourceVideo,
)
from protos.sp_spec import stage1_parallel

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


# ------------------------------------------------------------------ user LoRAs (issue #22)

MAX_LORAS = 8  # LoRAs in one set (ltx_engine.lora.MAX_LORAS holds the engine to the same number)
MAX_LORA_STRENGTH = 8.0  # |strength| above this is refused (upstream's CLI takes any float; past 2 is noise)
LORA_MODES = ("fused", "unfused")  # ltx_engine.lora.LORA_MODES


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


# ------------------------------------------------------------------ issue #26: per-render forward settings
def taus(name: str, value: object) -> tuple[float, ...]:
    """Sparse stage-2 attention: one finite tau per stage-2 step (the planner checks the count)."""
    if not isinstance(value, list | tuple) or not 1 <= len(value) <= 64:
        raise SpecError(f"{name} must be a list of 1..64 taus, one per stage-2 step, e.g. 1.0,1.25,1.5")
    return tuple(number(-1e6, 1e6)(name, v) for v in value)


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
    "images": images,
    "num_generated_keyframes": integer(0, MAX_IMAGES),
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
    "loras": loras,
    "lora_mode": lora_mode,
    "priority": integer(-1_000_000, 1_000_000),
    "submitter": text(256),
    "group": text(128, pattern=ID),
    "notify": text(2048, pattern=re.compile(r"https?://\S+")),
}
SPEC_FIELDS.update(GUIDANCE_FIELDS)  # the dev recipes' knobs (protos/guidance_spec.py)
SPEC_FIELDS |= {"sparse_attention": taus, "compute_dtype": text(32)}  # issue #26 (dtype names: the planner)
SPEC_FIELDS |= {"exr_colorspace": text(32), "auto_duration": seconds_range, "hdr": boolean}  # issue #29
SPEC_FIELDS |= {"stage1_parallel": stage1_parallel}  # issue #25 (protos/sp_spec.py)
VIDEO_DECODERS = ("conv", "diffusion")  # issue #29: the conv VAE decoder, or LTX-2.5's vae_decoder_av


def video_decoder(name: str, value: object) -> str:
    if value not in VIDEO_DECODERS:
        raise SpecError(f"{name} {str(value)[:40]!r}: give conv or diffusion")
    return str(value)


SPEC_FIELDS |= {"video_decoder": video_decoder}  # issue #29: --video-decoder conv|diffusion
SPEC_FIELDS |= {"dfr": boolean, "spatial_upscalings": integer(1, 2)}  # issue #29: DFR's base path, epilogue
SPEC_FIELDS |= MEDIA_FIELDS  # issue #24: --audio (A2V) and a source video (protos/media_spec.py)
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
    images: tuple[ImageCondition, ...] = ()  # keyframes, in order (the old single `image` maps to one)
    num_generated_keyframes: int = 0  # LTX-2.5 generated keyframe slots in stage 1 outside DFR
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
    loras: tuple[LoraRef, ...] = ()  # user LoRAs on every DiT task of the render (issue #22)
    lora_mode: str = "fused"  # fused: summed into the weights once per worker; unfused: run-time adapters
    # The recipe and its guidance (protos/guidance_spec.py); None = the recipe's upstream default.
    pipeline: str = "distilled"  # distilled | one-stage | two-stage | two-stage-hq
    steps: int | None = None  # dev stage 1 / one-stage steps (LTX2 scheduler)
    stage1_steps: int | None = None  # the same count by the MLX port's two-stage name (must agree with steps)
    stage2_steps: int | None = None  # stage 2: the last N steps of its sigma table (default all 3)
    cfg_scale: float | None = None
    stg_scale: float | None = None
    stg_blocks: tuple[int, ...] | None = None
    rescale: float | None = None
    modality_scale: float | None = None
    audio_cfg_scale: float | None = None
    audio_stg_scale: float | None = None
    audio_rescale: float | None = None
    audio_modality_scale: float | None = None
    negative_prompt: str | None = None  # None: upstream's default negative prompt (guided recipes)
    sparse_attention: tuple[float, ...] | None = None  # issue #26: stage-2 taus, one per step (None: dense)
    compute_dtype: str | None = None  # issue #26: "float16" / "bfloat16" attention and FF (None: float32)
    exr_colorspace: str | None = None  # issue #29: srgb-linear (None) | acescg | acescct (ltx_engine/color.py)
    auto_duration: tuple[float, float] | None = None  # issue #29: the DurationHead's [min, max] seconds
    hdr: bool = False  # issue #29: also an HLG 10-bit HEVC master of the decode (render_hlg.mp4)
    stage1_parallel: str = "auto"  # issue #25: "auto" | "1".."8" workers for sequence-parallel stage 1
    video_decoder: str | None = None  # issue #29: "conv" (None) | "diffusion" (LTX-2.5's vae_decoder_av)
    dfr: bool = False  # issue #29: DFR (LTX-2.5) even at 0 temporal rounds: its canvas, slots, keyframes
    spatial_upscalings: int = 1  # issue #29: 2 = DFR's stages at half size, then the spatial epilogue
    audio_input: AudioInput | None = None  # issue #24: --audio FILE [--audio-start S] (A2V: the track is frozen)
    source_video: SourceVideo | None = None  # issue #24: a source clip the render encodes (video_encode tasks)
    encode_tiles: str | None = None  # issue #24: the source's tiled encode, "F,S" pixels | auto | off
    control_video: ControlVideo | None = None  # issue #24: IC-LoRA control's clip (reference tokens in stage 1)
    ic_lora: IcLora | None = None  # issue #24: the IC-LoRA fused into stage 1 (control) or both stages (Dub-It)
    dub_video: ControlVideo | None = None  # issue #24: Dub-It's reference video (and its audio)
    retake: Retake | None = None  # issue #24 retake/extend: regenerate [start, end) s of source_video
    extend: Extend | None = None  # ... or add N latent frames after / before it
    hdr_ic_lora: HdrIcLora | None = None  # issue #29: the HDR IC-LoRA render's SDR clip (coordinator/plan/hdr.py)
    submitter: str | None = None
    priority: int | None = None
    group: str | None = None
    notify: str | None = None

    @classmethod
    def from_dict(cls, raw: Mapping[str, object]) -> RenderSpec:
        """The spec a client sent, checked field by field (None = the default); unknown fields refused."""
        raw = _legacy_image(raw)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - names - set(RESOLVED_ONLY))
        if unknown:
            raise SpecError(f"unknown spec field {str(unknown[0])[:60]!r}")
        typed = {key: SPEC_FIELDS.get(key, scalar)(key, value) for key, value in raw.items()
                 if value is not None and key in names}
        spec = cls(**typed)
        check_guidance(spec)
        return spec

    def to_dict(self) -> dict[str, JsonValue]:
        """The JSON form: every asked field (None where left out), the submit fields only when given."""
        out: dict[str, JsonValue] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in SUBMIT_FIELDS and value is None:
                continue
            out[f.name] = json_value(value)
        return out


def _legacy_image(raw: Mapping[str, object]) -> Mapping[str, object]:
    """An older client's single `image` object, as the first of `images` (mapped once, here)."""
    if "image" not in raw:
        return raw
    out = {k: v for k, v in raw.items() if k != "image"}
    if raw["image"] is not None:
        out["images"] = [raw["image"], *(raw.get("images") or [])]
    return out


def json_value(value: object) -> JsonValue:
    """A spec field as JSON holds it (an image as its object, sigmas as a list)."""
    if isinstance(value, (ImageCondition, LoraRef, *MEDIA_RECORDS)):
        return value.to_dict()
    if isinstance(value, tuple):
        return [json_value(v) for v in value]
    return value if isinstance(value, str | int | float | bool | list | dict) else None


def spec_field_names() -> tuple[str, ...]:
    """The fields a submit may carry (what `farm retry` sends again out of a recorded spec)."""
    return tuple(f.name for f in fields(RenderSpec))
