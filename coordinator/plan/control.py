"""IC-LoRA control and Dub-It in the stage graph. Pure.

IC-LoRA control (`control_video` + `ic_lora`, upstream 1.0.0 `ICLoraPipeline`): the control clip's
tiled `video_encode` tasks (`control.t{i}`, blended by the coordinator into `control`) at stage 1's
size over the LoRA's `reference_downscale_factor` (the spec records the factor the client read; the
coordinator's media check reads the uploaded file's header again); stage 1 takes that latent as
reference tokens (`control_latent`, params `control`) with the IC-LoRA fused on top of the render's
user LoRAs; the upsample and stage 2 (untiled or TDP-tiled) run on the plain DiT, as upstream's
clean stage 2; the decode as always. With `--control-stage2` (the MLX port's control-aware refine,
`ic-lora --upsample-only --refine-steps 3`: the IC-LoRA kept fused, the control re-encoded at full size)
the clip is encoded a second time (`control_s2`) at stage 2's size and stage 2 takes it and the IC-LoRA
as Dub-It's stage 2 takes its reference (no audio reference). With `--control-mask` (upstream's
`--conditioning-attention-mask`) a `control_mask` task per reference reads the mask clip at stage 1's
size and pools it to that reference's tokens (`ltx_engine.rules.ic_lora.latent_mask`): `control_mask`.

Dub-It (`dub_video` + `ic_lora`, upstream 1.2 `dubit.py`): the reference clip encoded twice (`dub_s1`
at stage 1's size, `dub_s2` at stage 2's, each over the downscale), its track encoded by an
`audio_encode` task (`dub_audio`); both stages run with the Dub-It LoRA and their own reference
video; stage 1's audio reference is the clip's track, stage 2's is stage 1's generated audio (which
stage 2 keeps frozen and the audio decode reads). A tiled stage 2 (`--stage2-tiles`) takes both where
DFR's tiled stage 2 takes its slots and IC-LoRA reference: `stage2.prep` appends the reference video
tokens (and the audio reference after the frozen audio), `tdp_cut` hands each tile the reference tokens
overlapping it as conditioning tokens, every tile forward reads prep's whole audio (reference included)
and runs with the Dub-It LoRA; the coordinator's step blends video only. Stage 1 gangs as any
(`--stage1-parallel`): the reference tokens split with the video's, an attention strength's mask by its
query rows, Dub-It's reference audio in the audio stream every rank holds whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coordinator.plan.graph import SPATIAL_FACTOR, SpecError, expect, ref, task
from coordinator.plan.media import audio_encode_task, encode_tile_sizes, video_encode_tasks
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.encode_tiling import crop_frames, latent_shape
from ltx_engine.rules.ic_lora import ControlError, control_size
from protos.lora_set import warm_key
from protos.media_spec import ControlVideo, IcLora


def _clip(spec: RenderPlan) -> tuple[str, str, ControlVideo] | None:
    """(spec key, flag, record) of the render's control or Dub-It clip; None without either."""
    for key, flag in (("control_video", "--control-video"), ("dub_video", "--dub")):
        value = getattr(spec, key)
        if value:
            return key, flag, value
    return None


def check_reference(spec: RenderPlan, key: str, flag: str) -> str:
    """A control or Dub-It clip's own rules (its IC-LoRA is given: the modifier table's `needs`): the clip's
    encode tiles are ones upstream's tiling takes, and each stage's reference is a size the VAE encodes
    whole; the clip's name."""
    value = getattr(spec, key)
    name = value.name or value.blob[:12]
    lora = spec.ic_lora
    encode_tile_sizes(spec)
    for height, width in _stage_sizes(spec, key):
        _reference_size(height, width, lora.downscale, flag, name)
    return name


def _stage_sizes(spec: RenderPlan, key: str) -> list[tuple[int, int]]:
    """The sizes the clip is a reference at: stage 1's, and stage 2's for Dub-It and `--control-stage2`."""
    half = (spec.height // 2, spec.width // 2)
    both = key == "dub_video" or getattr(spec, key).stage2
    return [half, (spec.height, spec.width)] if both else [half]


def _reference_size(height: int, width: int, downscale: int, flag: str, name: str) -> tuple[int, int]:
    """The reference's pixels at a stage of height x width; refused unless the VAE encodes it whole."""
    try:
        size = control_size(height, width, downscale)
    except ControlError as exc:
        raise SpecError(f"{flag} {name}: {exc}") from None
    if size[0] % SPATIAL_FACTOR or size[1] % SPATIAL_FACTOR:
        raise SpecError(
            f"{flag} {name}: the reference at {size[0]}x{size[1]} (a {height}x{width} stage over the IC-LoRA's "
            f"downscale {downscale}) is not a multiple of {SPATIAL_FACTOR} px: pick sides that are "
            f"multiples of {2 * SPATIAL_FACTOR * downscale}"
        )
    return size


def _with_lora(params: dict, lora: IcLora, control: dict | None) -> dict:
    """A DiT task's params with the IC-LoRA on top of its user LoRAs (fused), and the reference's (None:
    a tile forward, whose reference tokens come cut from `stage2.prep`)."""
    loras = [*(params.get("loras") or ()), {k: getattr(lora, k) for k in ("blob", "name", "strength") if getattr(lora, k)}]
    out = {**params, "loras": loras, "lora_mode": "fused", "warm": [warm_key(loras, "fused")]}
    return out if control is None else {**out, "control": control}


def _mask_task(rid: str, spec: RenderPlan, name: str, grid: tuple[int, int, int], first: int) -> dict:
    """The mask clip's frames [first, first + F) read at stage 1's size (as upstream reads it for either
    stage), grey in [0, 1], pooled to a reference latent's grid: (1, f*h*w) attention strengths."""
    frames = crop_frames(spec.frames)
    params = {"pack": spec.pack, "frames": frames, "height": spec.height // 2, "width": spec.width // 2,
              "first": int(first), "grid": list(grid), "expect": {"mask": expect("float32", 1, math.prod(grid))}}
    return task(rid, name, "control_mask", params, {"video": {"blob": spec.control_mask.blob}})


@dataclass(frozen=True, slots=True)
class Reference:
    """A control or Dub-It clip as the stage blocks apply it: its encodes (made just before stage 1), the
    IC-LoRA fused on top of the user's, the reference's params, and each stage's reference inputs (`stage2`
    None: a clean stage 2, IC-LoRA control's)."""

    tasks: tuple[dict, ...]
    lora: IcLora
    control: dict
    stage1: dict
    stage2: dict | None

    def dit(self, loras: dict, reference: bool = True) -> dict:
        """A DiT task's LoRA params (the render's `loras` + the IC-LoRA) and, with `reference`, the reference's."""
        return _with_lora(loras, self.lora, self.control if reference else None)


def reference(rid: str, spec: RenderPlan, first: int = 0) -> Reference | None:
    """The render's control / Dub-It reference (None without either): the clip encoded at each stage's size
    over the IC-LoRA's downscale (Dub-It: its track too, stage 1's audio reference; stage 2's is stage 1's
    generated audio). `first`: the clip's frame the stages' frame 0 is made to (a chunked window's start,
    `plan/chunks.py`; `rid` its prefix and `spec` its view): `spec.frames` frames from there, the track from
    its second."""
    clip = _clip(spec)
    if clip is None:
        return None
    key, _, value = clip
    lora, frames, sizes = spec.ic_lora, spec.frames, encode_tile_sizes(spec)
    control = {"strength": value.strength, "downscale": lora.downscale, "attention_strength": value.attention_strength}
    named = ["control", "control_s2"] if key == "control_video" else ["dub_s1", "dub_s2"]
    added, stages = [], []
    for name, (height, width) in zip(named, _stage_sizes(spec, key), strict=False):
        size = control_size(height, width, control["downscale"])
        encodes, latent = video_encode_tasks(rid, name, spec.pack, value.blob, (frames, *size), sizes, first)
        added, stages = added + encodes, stages + [{"control_latent": latent}]
        if spec.control_mask:  # its attention strengths per reference token (`--control-mask`)
            added.append(_mask_task(rid, spec, f"{name}_mask", latent_shape(crop_frames(frames), *size), first))
            stages[-1]["control_mask"] = ref(added[-1]["id"], "mask")
    if key == "control_video":  # stage 2 clean, or with the control at full size (`--control-stage2`)
        return Reference(tuple(added), lora, control, stages[0], stages[1] if value.stage2 else None)
    latents = [s["control_latent"] for s in stages]
    audio = audio_encode_task(rid, spec, "dub_audio", value.blob, first / spec.frame_rate)
    stage1 = {"control_latent": latents[0], "audio_reference": ref(audio["id"], "latent")}
    stage2 = {"control_latent": latents[1], "audio_reference": ref(f"{rid}.stage1", "audio_latent")}
    return Reference((*added, audio), lora, control, stage1, stage2)
