"""The farm's task kinds, written once: every kind's word and the facts each part reads about it.

Why here: a kind is part of the contract (the planner writes it into a task, the Lua and Redis hold it,
the worker and the coordinator's reducer dispatch on it, the dashboard names it), so its facts live in
one table that the parts derive their views from instead of keeping tables of their own. The Lua cannot
import Python: tests/unit/test_kinds.py holds every kind word the scripts use against `TaskKind`.

`TaskKind` is a `str` enum: a member equals its wire word, so nothing on the wire or in Redis changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class TaskKind(StrEnum):
    """What a task does; the value is the word in task records, Redis and events."""

    TEXT_ENCODE = "text_encode"
    ENHANCE_PROMPT = "enhance_prompt"
    IMAGE_ENCODE = "image_encode"
    DENOISE_STAGE1 = "denoise_stage1"
    DENOISE_STAGE2 = "denoise_stage2"
    TRANSFORMER_FORWARD = "transformer_forward"
    STAGE_PREPARE = "stage_prepare"
    UPSAMPLE_SPATIAL = "upsample_spatial"
    UPSAMPLE_TEMPORAL = "upsample_temporal"
    DFR_TILE = "dfr_tile"
    DFR_KEYFRAME_PLANE = "dfr_keyframe_plane"
    DECODE_VIDEO = "decode_video"
    DECODE_TILE = "decode_tile"
    DECODE_AUDIO = "decode_audio"
    PREDICT_DURATION = "predict_duration"
    GUIDANCE_PASS = "guidance_pass"
    AUDIO_ENCODE = "audio_encode"
    VIDEO_ENCODE = "video_encode"
    CONTROL_MASK = "control_mask"
    HDR_STAGE = "hdr_stage"
    TDP_CUT = "tdp_cut"
    TDP_STEP = "tdp_step"
    DFR_STITCH = "dfr_stitch"
    DFR_TRIM = "dfr_trim"
    DFR_EPI_WINDOW = "dfr_epi_window"
    GUIDE_STEP = "guide_step"
    VIDEO_ENCODE_BLEND = "video_encode_blend"
    EXTEND_AUDIO_PIN = "extend_audio_pin"
    EXTEND_JOIN = "extend_join"
    PLAN_LENGTH = "plan_length"
    CHUNK_CARRY = "chunk_carry"
    CHUNK_AUDIO_JOIN = "chunk_audio_join"
    CHUNK_LATENT_CARRY = "chunk_latent_carry"


class Cost(StrEnum):
    """How the cost model (coordinator/plan/costs.py) counts a kind's reference seconds and peak."""

    FORWARD = "forward"    # one DiT forward over the task's tokens
    STEPS = "steps"        # one DiT forward per sampler step
    DECODE = "decode"      # a VAE decode, per output pixel·frame
    KEYFRAME = "keyframe"  # one frame decoded and encoded again
    UPSAMPLE = "upsample"  # a latent upsampler, per output latent cell
    FIXED = "fixed"        # a fixed time (costs.FIXED_S)


@dataclass(frozen=True)
class KindFacts:
    """What the parts know about one kind. Components are pack component names (ltx_engine/rules/components.py)."""

    label: str = ""                    # the dashboard's words ("" : the kind's own)
    stage: str = ""                    # timeline stage when the task id names none ("" : the kind itself)
    components: tuple[str, ...] = ()   # what a worker loads for it (its model registry keeps them warm)
    also_needs: tuple[str, ...] = ()   # pack files the lease matches but the worker fuses, not loads
    weighs: tuple[str, ...] = ()       # weights the cost model counts for its load and peak
    cost: Cost = Cost.FIXED
    streams: bool = False              # its DiT may run block-streamed on a worker that cannot hold it
    operation: str = ""                # the worker's `Runner._run_<operation>` ("" : no worker runs it)
    reduce: str = ""                   # the coordinator's reducer step ("" : the coordinator never runs it)

    @property
    def runs_dit(self) -> bool:
        """Its work is DiT forwards: costed per token, and it carries the render's user LoRA set."""
        return self.cost in (Cost.FORWARD, Cost.STEPS)


_DIT = ("transformer",)
K = TaskKind
KINDS: dict[TaskKind, KindFacts] = {
    # A cached prompt's text task is answered on the coordinator with the embeddings lease.lua moved to it.
    K.TEXT_ENCODE: KindFacts("text encoding", "text", ("text_encoder", "connector"), (),
                             ("text_encoder", "connector"), operation="text_encode", reduce="embeddings"),
    # `--enhance-prompt`: the encoder's Gemma writes the prompt the text task encodes; cached as a text task is.
    K.ENHANCE_PROMPT: KindFacts("prompt enhancement", "text", ("text_encoder",), (), ("text_encoder",),
                                operation="enhance_prompt", reduce="embeddings"),
    K.IMAGE_ENCODE: KindFacts("image encoding", "image", ("vae_encoder",), (), ("vae_encoder",),
                              operation="image_encode"),
    K.DENOISE_STAGE1: KindFacts("stage 1 denoise", "stage1", _DIT, (), _DIT, Cost.STEPS, True, "denoise_stage1"),
    K.DENOISE_STAGE2: KindFacts("stage 2 denoise", "stage2", _DIT, (), _DIT, Cost.STEPS, True, "denoise_stage2"),
    K.TRANSFORMER_FORWARD: KindFacts("tile", "", _DIT, (), _DIT, Cost.FORWARD, True, "transformer_forward"),
    K.STAGE_PREPARE: KindFacts("prepare stage 2 inputs", "", (), (), ("vae_encoder",), operation="stage_prepare"),
    K.UPSAMPLE_SPATIAL: KindFacts("spatial upsample", "upsample", ("spatial_upscaler", "vae_decoder"), (),
                                  ("spatial_upscaler",), Cost.UPSAMPLE, operation="upsample_spatial"),
    K.UPSAMPLE_TEMPORAL: KindFacts("temporal upsample", "upsample", ("temporal_upscaler", "vae_decoder"), (),
                                   ("temporal_upscaler",), Cost.UPSAMPLE, operation="upsample_temporal"),
    K.DFR_TILE: KindFacts("tile", "dfr", _DIT, (), _DIT, Cost.STEPS, True, "dfr_tile"),
    # DFR's epilogue: a carried plane rebuilt at full size
    K.DFR_KEYFRAME_PLANE: KindFacts("rebuild keyframe", "dfr", ("vae_decoder", "vae_encoder"), (),
                                    ("vae_decoder", "vae_encoder"), Cost.KEYFRAME, operation="dfr_keyframe_plane"),
    K.DECODE_VIDEO: KindFacts("video decode", "decode", ("vae_decoder",), (), ("vae_decoder",), Cost.DECODE,
                              operation="decode_video"),
    K.DECODE_TILE: KindFacts("decode tile", "", ("vae_decoder",), (), ("vae_decoder",), Cost.DECODE,
                             operation="decode_tile"),
    K.DECODE_AUDIO: KindFacts("audio decode", "audio", ("audio_vae", "vocoder"), (), ("audio_vae", "vocoder"),
                              operation="decode_audio"),
    K.PREDICT_DURATION: KindFacts(components=("duration_head",), operation="predict_duration"),
    # one pass of a guided step (the dev recipes): one forward over the stage's tokens
    K.GUIDANCE_PASS: KindFacts(components=("transformer_dev",), weighs=_DIT, cost=Cost.FORWARD, streams=True,
                               operation="guidance_pass"),
    K.AUDIO_ENCODE: KindFacts("audio encode", components=("audio_vae",), operation="audio_encode"),
    K.VIDEO_ENCODE: KindFacts("encode tile", components=("vae_encoder",), operation="video_encode"),
    # an IC-LoRA control's mask clip read and pooled to its reference tokens' attention strengths (no model)
    K.CONTROL_MASK: KindFacts("control mask", operation="control_mask"),
    # The HDR IC-LoRA stage: fuses the pack's hdr_lora onto a resident DiT (never streamed, no user LoRAs).
    K.HDR_STAGE: KindFacts("HDR IC-LoRA denoise", "", _DIT, ("hdr_lora",), _DIT, Cost.STEPS, False, "hdr_stage"),
    K.TDP_CUT: KindFacts("cut into tiles", reduce="tdp_cut"),
    K.TDP_STEP: KindFacts("blend tiles + sampler step", reduce="tdp_step"),
    K.DFR_STITCH: KindFacts("stitch round", "dfr", reduce="dfr_stitch"),
    K.DFR_TRIM: KindFacts("trim to length", "dfr", reduce="dfr_trim"),
    K.DFR_EPI_WINDOW: KindFacts("cut epilogue window", "dfr", reduce="dfr_epi_window"),
    K.GUIDE_STEP: KindFacts(reduce="guide_step"),  # a guided step: combine its passes, step
    K.VIDEO_ENCODE_BLEND: KindFacts("blend encode tiles", reduce="video_encode_blend"),
    K.EXTEND_AUDIO_PIN: KindFacts(reduce="extend_audio_pin"),  # retake/extend
    K.EXTEND_JOIN: KindFacts(reduce="extend_join"),
    K.PLAN_LENGTH: KindFacts(reduce="plan_length"),  # the reducer thread plans the rest of the render
    # chunked renders: a window's last decoded frames (the next window's conditioning), the windows' audio joined
    K.CHUNK_CARRY: KindFacts("carry frames", reduce="chunk_carry"),
    K.CHUNK_AUDIO_JOIN: KindFacts("join audio", reduce="chunk_audio_join"),
    K.CHUNK_LATENT_CARRY: KindFacts("carry latents", reduce="chunk_latent_carry"),  # --chunk-carry latent
}
NO_FACTS = KindFacts()  # what an unknown word reads as: loads nothing, fixed cost, no label


def facts(kind: str) -> KindFacts:
    """The facts of a kind word (a member or its plain string); an unknown word reads as NO_FACTS."""
    return KINDS.get(kind, NO_FACTS)  # type: ignore[call-overload] - a StrEnum hashes as its word


# Derived views.
WORKER_KINDS: tuple[TaskKind, ...] = tuple(k for k, f in KINDS.items() if f.operation)
DIT_KINDS: tuple[TaskKind, ...] = tuple(k for k, f in KINDS.items() if f.runs_dit)
