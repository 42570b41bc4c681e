"""A stage's states for the media pipelines (retake, extend, IC-LoRA control, Dub-It): the hooks
`denoise.build_stage_states` calls, given latents already encoded (the farm's encode tasks, or an
in-process encode for `--local`).

StageInputs fields they read:
- `retake` (`retake.RetakeWindow`): `initial_video` / `initial_audio` are the source's latents at the
  stage's grid; the window's masks replace the all-ones ones; one stage, from noise inside the window.
- `audio_pin` / `audio_pin_start` (extend): the source's boundary audio latent pinned (mask 0) into the
  generated audio; the video context is an `images` replace (`extend_context`).
- `control` (`ic_lora.ControlReference`): reference tokens appended last, before the noise is drawn;
  an attention strength below 1 gives the forward a self-attention mask (`attention_mask`).
- `audio_reference` (Dub-It): reference audio tokens appended after the noised audio (mask 0, so the
  noise would not touch them); outputs drop them (`generated_audio`).
"""

from __future__ import annotations

import numpy as np

from ltx_engine.conditioning import REPLACE, ImageCondition
from ltx_engine.rules import extend, ic_lora, retake, sampling
from ltx_engine.rules.dubit import append_audio_reference
from ltx_engine.rules.sampling import LatentState
from ltx_engine.rules.tokens import patchify_audio, patchify_video


def retake_stage_states(inputs, vpos: np.ndarray, apos: np.ndarray) -> tuple[LatentState, LatentState]:
    """Noised retake states; without source audio the audio is generated whole (upstream: no mask item)."""
    if inputs.initial_video is None:
        raise ValueError("a retake stage needs the source's video latent (initial_video)")
    audio_src = (
        None if inputs.initial_audio is None else patchify_audio(inputs.initial_audio.astype(np.float32))
    )
    video, audio = retake.retake_states(
        patchify_video(inputs.initial_video.astype(np.float32)),
        audio_src,
        inputs.retake,
        inputs.latent_grid,
        inputs.fps,
        (vpos, apos),
    )
    sigma0 = float(inputs.sigmas[0])
    v_stream = sampling.stream_id(sampling.STREAM_VIDEO, inputs.noise_stream)
    a_stream = sampling.stream_id(sampling.STREAM_AUDIO, inputs.noise_stream)
    video = retake.noised(video, inputs.seed, v_stream, sigma0)
    if audio is None:
        clean = np.zeros((1, inputs.audio_frames, inputs.audio_channels * inputs.mel_bins), np.float32)
        audio = LatentState.initial(clean, apos)
    return video, retake.noised(audio, inputs.seed, a_stream, sigma0)


def apply_control(video: LatentState, inputs) -> LatentState:
    """The control reference appended (IC-LoRA control, Dub-It's reference video); not with DFR slots."""
    if inputs.slots:
        raise ValueError("a control reference and DFR keyframe slots in one stage are not built")
    return ic_lora.append_control(video, None, inputs.control, inputs.fps, inputs.video_tokens)[0]


def attention_mask(inputs, num_tokens: int) -> np.ndarray | None:
    """The stage's (1, T, T) self-attention mask, or None for full attention."""
    ref = inputs.control
    if ref is None or ref.cross() is None:
        return None
    return ic_lora.update_attention_mask(
        None, ref.cross(), inputs.video_tokens, num_tokens - ref.tokens, ref.tokens
    )


def refuse_unmasked(inputs, where: str) -> None:
    """A stage path that carries no self-attention mask (a stage run as prepared token arrays) refuses a
    control that would need one, rather than run without."""
    if inputs.control is not None and inputs.control.cross() is not None:
        raise ValueError(f"{where}: an IC-LoRA control with attention strength below 1 is not built there")


def pin_audio(audio: LatentState, inputs) -> LatentState:
    """Extend: the source's boundary audio tokens pinned at `audio_pin_start` (mask 0, clean = latent)."""
    tokens = patchify_audio(inputs.audio_pin.astype(np.float32))
    return audio.replace_tokens(inputs.audio_pin_start, tokens, 1.0)


def reference_audio(audio: LatentState, inputs) -> LatentState:
    return append_audio_reference(audio, inputs.audio_reference)


def generated_audio(audio: LatentState, inputs) -> LatentState:
    """The audio state without Dub-It's appended reference tokens."""
    return audio if inputs.audio_reference is None else audio.truncate(inputs.audio_frames)


def extend_context(layout: extend.ExtendLayout, context_latent: np.ndarray) -> ImageCondition:
    """Extend's pinned context (the source's re-encoded 25 boundary frames) as a stage's replace condition."""
    if context_latent.shape[2] != extend.CONTEXT_LATENT_FRAMES:
        raise extend.ExtendError(
            f"the extend context has {context_latent.shape[2]} latent frames, not {extend.CONTEXT_LATENT_FRAMES}"
        )
    return ImageCondition(context_latent, layout.context_frame, 1.0, REPLACE, "extend context")


def stage_fields(params: dict, inputs: dict) -> dict:
    """The media pipelines' StageInputs fields from a task's params and input arrays, the names written
    once for the planner and the worker (`**stage_fields(params, inputs)` beside the others):
    params `retake` [start, end, regen_audio], `audio_pin_start`, `control` {strength, attention_strength,
    downscale}; inputs `audio_pin`, `control_latent`, `control_mask` (1, M), `audio_reference`."""
    out: dict = {}
    if params.get("retake") is not None:
        start, end, regen = params["retake"]
        out["retake"] = retake.RetakeWindow(float(start), float(end), bool(regen))
    if inputs.get("audio_pin") is not None:
        out |= {"audio_pin": inputs["audio_pin"], "audio_pin_start": int(params.get("audio_pin_start", 0))}
    if inputs.get("control_latent") is not None:
        c = params.get("control") or {}
        out["control"] = ic_lora.ControlReference(
            inputs["control_latent"],
            float(c.get("strength", 1.0)),
            float(c.get("attention_strength", 1.0)),
            int(c.get("downscale", 1)),
            inputs.get("control_mask"),
        )
    if inputs.get("audio_reference") is not None:
        out["audio_reference"] = inputs["audio_reference"]
    return out
