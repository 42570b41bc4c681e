"""The text-to-audio graph (`--pipeline t2a`, upstream's t2a_one_stage). Pure.

Text and the negative prompt's text, the audio's initial state alone (`stage_prepare` with
`audio_only`: noise at the schedule's first sigma, no video tokens), the guided stage with no video
stream (each pass reads the audio context alone and runs the dev DiT's audio stream, as upstream's
`video=None`; each guide step combines the audio x0 alone), then the audio decode (audio VAE + vocoder). No video task: the
assembler writes the waveform as a WAV. The audio's length follows the clip's, frames at the rate
(upstream's `AudioLatentShape.from_video_pixel_shape`: 25 latent frames a second).
"""

from __future__ import annotations

from collections.abc import Callable

from coordinator.plan.graph import audio_latent_frames, expect, ref, task
from coordinator.plan.guidance import GuidedStage, plan_guided_stage
from coordinator.plan.guided_render import AUDIO_CHANNELS, contexts_of, negative_text_task
from coordinator.plan.loras import lora_params
from coordinator.plan.resolved import RenderPlan


def _length(spec: RenderPlan) -> tuple[str, int, int, float]:
    """The fields the graph reads beside the recipe: pack, seed, and the duration as frames at a rate."""
    return spec.pack, spec.seed, spec.frames, spec.frame_rate


def plan_audio_only(rid: str, spec: RenderPlan, text_task: dict, ctx: dict, key: Callable,
                    rec: GuidedStage) -> list[dict]:
    """The graph after the prompt's text task: the negative text, prepare, the guided stage named `stage1`
    (its last step's `audio_latent`), the `audio` decode. `key`: the text cache key of a spec; `rec`: the
    recipe's guided stage."""
    pack, seed, frames, fps = _length(spec)
    a_lat = audio_latent_frames(frames, fps)
    params = {"pack": pack, "seed": seed, "frames": frames, "fps": fps, "sigmas": list(rec.sigmas),
              "audio_frames": a_lat}
    negative = negative_text_task(rid, spec, rec, text_task, key)
    prep = task(rid, "stage1.prep", "stage_prepare", {**params, "audio_only": True, "expect": {}}, {})
    contexts = {"prompt": ctx, "negative": contexts_of(negative["id"])}
    audio_ctx = {which: {k: r for k, r in c.items() if k != "video_context"} for which, c in contexts.items()}
    stage = plan_guided_stage(rid, "stage1", rec, params, prep["id"], audio_ctx, audio=True,
                              finish={"audio_channels": AUDIO_CHANNELS}, video=False, loras=lora_params(spec))
    stage[-1]["params"]["expect"] = {"audio_latent": expect("float32", 1, -1, a_lat, -1)}
    decode = task(rid, "audio", "decode_audio", {
        "pack": pack, "product": "audio", "expect": {"waveform": expect("float32", -1, -1),
                                                     "sample_rate": expect("int32", 1)}},
        {"latent": ref(f"{rid}.stage1", "audio_latent")})
    return [negative, prep, *stage, decode]
