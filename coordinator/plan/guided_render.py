"""The guided recipes' stage graphs (so far: `--pipeline one-stage`). Pure.

One-stage (ltx-pipelines' TI2VidOneStagePipeline): text and the negative prompt's text (a second
`text_encode`, cached by its own key), the stage's initial state at full resolution (`stage_prepare`:
noise at the LTX2 schedule's first sigma, image conditioning when given), the guided stage as pass
tasks + guide steps (`plan/guidance.py`), then the decode and the audio decode as every render.
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


def plan_one_stage(rid: str, spec: Mapping, rec: Recipe, ctx: dict, negative_ctx: dict, cond: dict,
                   image_params: dict) -> list[dict]:
    """Prepare + the guided stage, its last guide step named `stage1` with `video_latent` (full
    resolution) and `audio_latent`, what decode and decode_audio read."""
    frames, fps = int(spec["frames"]), float(spec["frame_rate"])
    grid = (latent_frames(frames), spec["height"] // SPATIAL_FACTOR, spec["width"] // SPATIAL_FACTOR)
    params = {"pack": spec["pack"], "seed": int(spec["seed"]), "frames": frames, "fps": fps,
              "height": spec["height"], "width": spec["width"], "sigmas": list(rec.sigmas),
              "audio_frames": audio_latent_frames(frames, fps), **image_params}
    prep = task(rid, "stage1.prep", "stage_prepare", {**params, "expect": {}}, dict(cond))
    finish = {"grid": list(grid), "audio_channels": AUDIO_CHANNELS}
    stage = plan_guided_stage(rid, "stage1", rec, params, prep["id"], {"prompt": ctx, "negative": negative_ctx},
                              audio=True, finish=finish)
    stage[-1]["params"]["expect"] = {"video_latent": expect("float32", 1, -1, *grid)}
    return [prep, *stage]


def contexts_of(task_id: str) -> dict:
    return {k: ref(task_id, k) for k in ("video_context", "audio_context", "context_mask")}
