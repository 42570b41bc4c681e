"""The guided recipes' stage graphs (so far: `--pipeline one-stage` and `two-stage`). Pure.

One-stage (ltx-pipelines' TI2VidOneStagePipeline): text and the negative prompt's text (a second
`text_encode`, cached by its own key), the stage's initial state at full resolution (`stage_prepare`:
noise at the LTX2 schedule's first sigma, image conditioning when given), the guided stage as pass
tasks + guide steps (`plan/guidance.py`), then the decode and the audio decode as every render.
Two-stage (TI2VidTwoStagesPipeline): the same guided stage 1 at half resolution, then the distilled
render's upsample and stage 2 unchanged (its `transformer`: the distilled DiT, or on a dev-only pack
the dev DiT with the distilled LoRA fused, which is upstream's stage-2 model).
"""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.plan.graph import SPATIAL_FACTOR, audio_latent_frames, expect, latent_frames, ref, task
from coordinator.plan.guidance import Recipe, plan_guided_stage

AUDIO_CHANNELS = 8  # the audio VAE's latent channels (z_channels) the stage's audio tokens fold back into


def negative_text_task(rid: str, spec: Mapping, rec: Recipe, text_task: dict, key) -> dict:
    """The negative prompt's text task: the prompt's, with the negative text and its own cache key."""
    params = {**text_task["params"], "prompt": rec.negative_prompt,
              "text_key": key({**spec, "prompt": rec.negative_prompt})}
    return task(rid, "negative", "text_encode", params, {})


def plan_guided_stage1(rid: str, spec: Mapping, rec: Recipe, ctx: dict, negative_ctx: dict, cond: dict,
                       image_params: dict, height: int, width: int) -> list[dict]:
    """Prepare + the guided stage at height x width, its last guide step named `stage1` with
    `video_latent` and `audio_latent`, what the upsample (or the decode) and decode_audio read."""
    frames, fps = int(spec["frames"]), float(spec["frame_rate"])
    grid = (latent_frames(frames), height // SPATIAL_FACTOR, width // SPATIAL_FACTOR)
    params = {"pack": spec["pack"], "seed": int(spec["seed"]), "frames": frames, "fps": fps,
              "height": height, "width": width, "sigmas": list(rec.sigmas),
              "audio_frames": audio_latent_frames(frames, fps), **image_params}
    prep = task(rid, "stage1.prep", "stage_prepare", {**params, "expect": {}}, dict(cond))
    finish = {"grid": list(grid), "audio_channels": AUDIO_CHANNELS}
    stage = plan_guided_stage(rid, "stage1", rec, params, prep["id"], {"prompt": ctx, "negative": negative_ctx},
                              audio=True, finish=finish)
    stage[-1]["params"]["expect"] = {"video_latent": expect("float32", 1, -1, *grid)}
    return [prep, *stage]


def contexts_of(task_id: str) -> dict:
    return {k: ref(task_id, k) for k in ("video_context", "audio_context", "context_mask")}
