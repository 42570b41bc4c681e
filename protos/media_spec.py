"""The spec's media inputs: a user's own audio track (A2V) and a source video.

Why its own module: the records cross the CLI -> coordinator boundary inside `RenderSpec`, and their
rules (a blob named by its sha256, a start inside bounds, the client's file name for the one-line
refusals) are checked once where the spec enters, as every other field's. What the file holds (a
stream, a duration the start falls inside) is the coordinator's media probe's business, not this one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from protos.fields import SpecError, integer, number, text

SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_IC_LORA_STRENGTH = 4.0
MAX_AUDIO_START_S = 3600.0  # past any file the probe accepts (its duration limit is the real bound)


@dataclass(frozen=True, slots=True)
class AudioInput:
    """An audio track the video is generated to (`--audio FILE [--audio-start S]`): the uploaded file's
    sha256, where in it the clip starts (seconds), and the client's file name (for refusals)."""

    blob: str
    start: float = 0.0
    name: str | None = None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True, slots=True)
class SourceVideo:
    """A source clip a render encodes (`video_encode` tasks): the uploaded file's sha256 and its name."""

    blob: str
    name: str | None = None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True, slots=True)
class HdrIcLora:
    """The HDR IC-LoRA render's SDR clip (`--hdr-ic-lora CLIP`): the uploaded file's sha256 and
    name, whether the DFR seams get keyframe slots and guides (`--no-keyframes`: not), and how the clip's
    codes are read (`--input-colorspace` srgb_gamma | srgb)."""

    blob: str
    name: str | None = None
    keyframes: bool = True
    input_colorspace: str = "srgb_gamma"

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def _blob(name: str, value: dict) -> str:
    if value.get("blob") is None:
        raise SpecError(f"{name} names no uploaded blob")
    return text(64, pattern=SHA256)(f"{name} blob", value["blob"])


def _file_name(name: str, value: dict) -> str | None:
    return None if value.get("name") is None else text(255)(f"{name} name", value["name"])


def audio_input(name: str, value: object) -> AudioInput:
    if isinstance(value, AudioInput):
        value = value.to_dict()
    if not isinstance(value, dict) or set(value) - {"blob", "start", "name"}:
        raise SpecError(f"{name} must be {{blob, start, name}}")
    start = (  # named by its flag: the field's name means nothing to the person who typed it
        0.0 if value.get("start") is None else number(0.0, MAX_AUDIO_START_S)("--audio-start", value["start"])
    )
    return AudioInput(blob=_blob(name, value), start=float(start), name=_file_name(name, value))


def source_video(name: str, value: object) -> SourceVideo:
    if isinstance(value, SourceVideo):
        value = value.to_dict()
    if not isinstance(value, dict) or set(value) - {"blob", "name"}:
        raise SpecError(f"{name} must be {{blob, name}}")
    return SourceVideo(blob=_blob(name, value), name=_file_name(name, value))


@dataclass(frozen=True, slots=True)
class ControlVideo:
    """An IC-LoRA control clip (`--control-video FILE STRENGTH`, `--control-attention A`) or Dub-It's
    reference (`--dub VIDEO`): the uploaded file's sha256, its conditioning strength (the reference's
    denoise mask is 1 - strength, upstream's `--video-conditioning V S`), its attention strength and name;
    `stage2` (`--control-stage2`): the control in stage 2 too, at full size with its IC-LoRA."""

    blob: str
    strength: float = 1.0
    attention_strength: float = 1.0
    name: str | None = None
    stage2: bool = False

    def to_dict(self) -> dict:
        """Its fields but the unset ones (a spec without `--control-stage2` records no `stage2`)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None and v is not False}


@dataclass(frozen=True, slots=True)
class IcLora:
    """The IC-LoRA a control render fuses into stage 1 (`--ic-lora FILE STRENGTH`): an uploaded file's
    sha256, its strength, and the `reference_downscale_factor` its metadata declares (the client reads it
    to plan; the coordinator reads the uploaded blob's header again and refuses a mismatch)."""

    blob: str
    strength: float
    downscale: int
    name: str | None = None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def control_video(name: str, value: object) -> ControlVideo:
    if isinstance(value, ControlVideo):
        value = value.to_dict()
    if not isinstance(value, dict) or set(value) - {"blob", "strength", "attention_strength", "name", "stage2"}:
        raise SpecError(f"{name} must be {{blob, strength, attention_strength, name, stage2}}")
    unit = number(0.0, 1.0)
    stage2 = value.get("stage2", False)
    if not isinstance(stage2, bool):
        raise SpecError(f"{name} stage2 must be true or false")
    return ControlVideo(
        blob=_blob(name, value),
        strength=float(unit(f"{name} strength", value.get("strength", 1.0))),
        attention_strength=float(unit(f"{name} attention strength", value.get("attention_strength", 1.0))),
        name=_file_name(name, value),
        stage2=stage2,
    )


def ic_lora(name: str, value: object) -> IcLora:
    if isinstance(value, IcLora):
        value = value.to_dict()
    if not isinstance(value, dict) or set(value) - {"blob", "strength", "downscale", "name"}:
        raise SpecError(f"{name} must be {{blob, strength, downscale, name}}")
    return IcLora(
        blob=_blob(name, value),
        strength=float(
            number(-MAX_IC_LORA_STRENGTH, MAX_IC_LORA_STRENGTH)(f"{name} strength", value.get("strength"))
        ),
        downscale=int(integer(1, 16)(f"{name} downscale", value.get("downscale"))),
        name=_file_name(name, value),
    )


# retake/extend: the window of a source clip a render regenerates, or the frames it adds
MAX_EXTEND_FRAMES = 64  # latent frames one extend adds (the planner holds the window to the model's range)
DIRECTIONS = ("after", "before")


@dataclass(frozen=True, slots=True)
class Retake:
    """`--retake VIDEO --start S --end E [--no-regen-audio]`: [start, end) seconds of `source_video`."""

    start: float
    end: float
    regen_audio: bool = True

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class Extend:
    """`--extend VIDEO --extend-frames N [--direction after|before]`: N new latent frames (8 N pixels)."""

    frames: int
    direction: str = "after"

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def retake(name: str, value: object) -> Retake:
    if isinstance(value, Retake):
        value = value.to_dict()
    if not isinstance(value, dict) or set(value) - {"start", "end", "regen_audio"} or "end" not in value:
        raise SpecError(f"{name} must be {{start, end, regen_audio}}")
    start = number(0.0, MAX_AUDIO_START_S)("--start", value.get("start") or 0.0)
    end = number(0.0, MAX_AUDIO_START_S)("--end", value["end"])
    if end <= start:
        raise SpecError(f"--retake window --start {start:g} s to --end {end:g} s is empty")
    regen = value.get("regen_audio", True)
    if not isinstance(regen, bool):
        raise SpecError(f"{name} regen_audio must be true or false")
    return Retake(float(start), float(end), regen)


def extend(name: str, value: object) -> Extend:
    if isinstance(value, Extend):
        value = value.to_dict()
    if not isinstance(value, dict) or set(value) - {"frames", "direction"}:
        raise SpecError(f"{name} must be {{frames, direction}}")
    frames = value.get("frames")
    if not isinstance(frames, int) or isinstance(frames, bool) or not 1 <= frames <= MAX_EXTEND_FRAMES:
        raise SpecError(f"--extend-frames {str(frames)[:20]} must be 1..{MAX_EXTEND_FRAMES} latent frames")
    direction = value.get("direction") or "after"
    if direction not in DIRECTIONS:
        raise SpecError(f"--direction {str(direction)[:20]!r}: one of {', '.join(DIRECTIONS)}")
    return Extend(frames, direction)


MEDIA_FIELDS = {"audio_input": audio_input, "source_video": source_video, "encode_tiles": text(32)}
MEDIA_FIELDS |= {"retake": retake, "extend": extend}  # retake/extend
MEDIA_FIELDS |= {
    "control_video": control_video,
    "ic_lora": ic_lora,
    "dub_video": control_video,
    "control_mask": source_video,
}  # IC-LoRA, Dub-It
MEDIA_RECORDS = (AudioInput, SourceVideo, Retake, Extend, ControlVideo, IcLora)


def hdr_ic_lora(name: str, value: object) -> HdrIcLora:
    if isinstance(value, HdrIcLora):
        value = value.to_dict()
    if not isinstance(value, dict) or set(value) - {"blob", "name", "keyframes", "input_colorspace"}:
        raise SpecError(f"{name} must be {{blob, name, keyframes, input_colorspace}}")
    space = value.get("input_colorspace") or "srgb_gamma"
    if space not in SDR_INPUT_COLORSPACES:
        raise SpecError(f"--input-colorspace {str(space)[:40]!r}: an SDR clip's is srgb_gamma or srgb")
    keyframes = value.get("keyframes", True)
    if not isinstance(keyframes, bool):
        raise SpecError(f"{name} keyframes must be true or false")
    return HdrIcLora(_blob(name, value), _file_name(name, value), keyframes, space)


SDR_INPUT_COLORSPACES = ("srgb_gamma", "srgb")  # ltx_engine.rules.hdr.sdr_working's
MEDIA_FIELDS |= {"hdr_ic_lora": hdr_ic_lora}  # the HDR IC-LoRA render's SDR clip
MEDIA_RECORDS += (HdrIcLora,)
