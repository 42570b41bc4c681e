"""The HDR IC-LoRA stage on a worker (`hdr_stage`): the engine oracle's own stage
(`ltx_engine.hdr_pipeline.stage_inputs` / `denoise_video`) from the planner's params and the encode
tasks' latents, on the pack with its SDR-to-HDR LoRA fused at 1.0 (warm under its own key). Like stage 1 it may
run split: k shards in the process (`stage1_parallel`, `--local`'s plan), a gang's rank (`group`), or resumed
from a gang's kept step (worker/sp_stage.py)."""

from __future__ import annotations

import numpy as np

from ltx_engine import hdr_pipeline
from ltx_engine.conditioning import GUIDE, ImageCondition
from ltx_engine.loading.pack import WeightPack
from ltx_engine.lora.lora import WithLoras
from ltx_engine.rules import hdr_lora
from worker.sp_stage import resume_from, split_of


def hdr_stage(engine, pack: WeightPack, params: dict, inputs: dict[str, np.ndarray], progress=None, group=None,
              on_step=None) -> dict[str, np.ndarray]:
    """The stage's video latent (and slots); a LoRA file that is missing, not an HDR LoRA or of another
    transfer than the plan's fails the task in one line."""
    lora = pack.root / str(params["hdr_lora"])
    config = hdr_lora.refuse_lora(lora)
    if config.transfer != params["transfer"] or config.downscale != 1:
        raise hdr_lora.HdrRefusal(
            f"{lora.name}: transfer {config.transfer}, downscale {config.downscale}; "
            f"the farm plans {params['transfer']} at downscale 1"
        )
    render = hdr_pipeline.HdrRender(
        float(params["fps"]),
        int(params["seed"]),
        inputs["video_context"],
        config.transfer,
        keyframe_strength=float(params["keyframe_strength"]),
    )
    seams = tuple(int(s) for s in params["slots"])
    guides = tuple(
        ImageCondition(inputs[f"guide{k}"], s, render.keyframe_strength, GUIDE, "seam")
        for k, s in enumerate(seams)
    )
    shape = np.broadcast_to(
        np.float32(0), (1, 3, int(params["frames"]), int(params["height"]), int(params["width"]))
    )
    stage = hdr_pipeline.stage_inputs(render, shape, inputs["reference_latent"], guides, seams)
    fused = WithLoras(pack, ((str(lora), hdr_lora.HDR_LORA_STRENGTH),))
    split = split_of(params, group)  # one shard: the plain loop, as run_stage1 takes it
    return hdr_pipeline.denoise_video(engine, fused, stage, split if split.degree > 1 else None, progress,
                                      resume_from(params, inputs), on_step)
