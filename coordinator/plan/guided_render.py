"""The guided recipes' stage graphs (so far: `--pipeline one-stage` and `two-stage`). Pure.

One-stage (ltx-pipelines' TI2VidOneStagePipeline): text and the negative prompt's text (a second
`text_encode`, cached by its own key), the stage's initial state at full resolution (`stage_prepare`:
noise at the LTX2 schedule's first sigma, image conditioning when given), the guided stage as pass
tasks + guide steps (`plan/guidance.py`), then the decode and the audio decode as every render.
Two-stage (TI2VidTwoStagesPipeline): the same guided stage 1 at half resolution, then the distilled
render's upsample and stage 2, whose DiT is upstream's: the dev DiT with the distilled LoRA fused
(`distilled_lora_strength`, `ltx_engine/lora/dev_distilled.py`), never the distilled checkpoint. Two-stage HQ
(TI2VidTwoStagesHQPipeline): stage 1 res_2s on dev + distilled LoRA 0.25, then stage 2 res_2s (3 steps x
2 evaluations + the final one, each a cond-only pass task and a guide step) on dev + LoRA 0.5.
Stage-2 audio follows upstream main (1.2.0, written in tests/parity/upstream_rules.py): re-noised at the
first stage-2 sigma and denoised beside the video, whose cross-attention reads it, then discarded: the
render's audio is stage 1's (1.0.0 decoded stage 2's). Tiled stage 2 keeps it frozen, as TDP does.
`--num-generated-keyframes`: the prep appends the slots, every pass carries them (`guidance.marker_params`),
the last guide step reads them out as `slots`, as upstream forwards them to its guided first stage.
"""

from __future__ import annotations

from dataclasses import replace

from coordinator.plan.graph import StageGeometry, expect, ref, task
from coordinator.plan.guidance import RES_2S, GuidedStage, plan_guided_stage
from coordinator.plan.images import slot_range
from coordinator.plan.loras import lora_text
from coordinator.plan.relay import without_relay
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules import guidance as G

AUDIO_CHANNELS = 8  # the audio VAE's latent channels (z_channels) the stage's audio tokens fold back into


def negative_text_task(rid: str, spec: RenderPlan, rec: GuidedStage, text_task: dict, key) -> dict:
    """The negative prompt's text task: the prompt's, with the negative text and its own cache key (on the
    render's LoRA set too)."""
    params = {**without_relay(text_task["params"]), "prompt": rec.negative_prompt,
              "text_key": key(spec.with_asked(prompt=rec.negative_prompt))}
    return lora_text(task(rid, "negative", "text_encode", params, {}), spec)


def plan_guided_stage1(rid: str, geo: StageGeometry, rec: GuidedStage, ctx: dict, negative_ctx: dict, cond: dict,
                       image_params: dict, loras: dict, expected: dict | None = None) -> list[dict]:
    """Prepare + the guided stage at `geo`, its last guide step named `stage1` with `video_latent` and
    `audio_latent`, what the upsample (or the decode) and decode_audio read, and (`generated_slots` in
    `image_params`, `expected`) the slots' latent: the prep appends them, every pass carries them."""
    grid = geo.grid
    params = {**geo.params(), "sigmas": list(rec.sigmas), **image_params}
    prep = task(rid, "stage1.prep", "stage_prepare", {**params, "expect": {}}, dict(cond))
    stage = plan_guided_stage(rid, "stage1", rec, params, prep["id"], {"prompt": ctx, "negative": negative_ctx},
                              audio=True, finish=_finish(params, grid), loras=loras)
    stage[-1]["params"]["expect"] = {"video_latent": expect("float32", 1, -1, *grid), **(expected or {})}
    return [prep, *stage]


def _finish(params: dict, grid: tuple[int, int, int]) -> dict:
    """The last guide step's read-out: the video on `grid`, the audio, the stage's slots when it has them."""
    slots = slot_range(params, grid)
    return {"grid": list(grid), "audio_channels": AUDIO_CHANNELS, **({} if slots is None else {"slot_range": slots})}


def contexts_of(task_id: str) -> dict:
    return {k: ref(task_id, k) for k in ("video_context", "audio_context", "context_mask")}


NO_GUIDANCE = G.GuiderParams()  # stage 2's SimpleDenoiser: the cond pass alone
STAGE2_STREAMS = 1 << 12         # stage 2's res_2s SDE noise streams start past any stage-1 step


def stage2_recipe(rec: GuidedStage, sigmas: list[float]) -> GuidedStage:
    """HQ's stage 2 as a guided stage: res_2s on the stage-2 table, one cond pass per evaluation."""
    return replace(rec, sampler=RES_2S, sigmas=tuple(float(s) for s in sigmas), video=NO_GUIDANCE,
                   audio=NO_GUIDANCE, distilled_lora=rec.stage2_lora, stream_offset=STAGE2_STREAMS,
                   stage1_parallel=None)  # --stage1-parallel splits stage 1's passes alone


def plan_hq_stage2(rid: str, rec: GuidedStage, params: dict, inputs: dict, ctx: dict, loras: dict) -> list[dict]:
    """Prepare (the upsampled video and stage 1's audio, re-noised at the first sigma), then res_2s."""
    grid = tuple(params["expect"]["video_latent"]["shape"][2:])
    base = {k: v for k, v in params.items() if k not in ("expect", "needs", "distilled_lora_strength")}
    prep = task(rid, "stage2.prep", "stage_prepare", {**base, "expect": {}}, inputs)
    stage = plan_guided_stage(rid, "stage2", stage2_recipe(rec, params["sigmas"]), base, prep["id"],
                              {"prompt": ctx, "negative": ctx}, audio=True, finish=_finish(base, grid), loras=loras)
    stage[-1]["params"]["expect"] = {k: v for k, v in params["expect"].items() if k in ("video_latent", "slots")}
    return [prep, *stage]


def stage2_line(spec: RenderPlan, rec: GuidedStage) -> str | None:
    """`farm plan`'s stage-2 line of a two-stage recipe: its steps, evaluations and pass, and its DiT."""
    if rec.stage2_lora is None:
        return None
    from coordinator.plan.stage2 import stage2_sigmas

    steps = len(stage2_sigmas(spec)) - 1
    if rec.sampler == RES_2S:
        how = f"{steps} steps x 2 evaluations x 1 pass (cond) + the final evaluation"
    else:
        how = f"{steps} steps x 1 forward (cond; tiles x steps with --stage2-tiles)"
    return f"stage 2: {how} on dev + distilled LoRA {rec.stage2_lora:g}"
