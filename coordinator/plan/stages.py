"""The stage blocks the two-stage recipes compose: stage 1, the spatial upsample and stage 2. Pure.

Why blocks of a geometry: a block takes the clip its stage denoises (`StageGeometry`: the pack, seed,
length, rate and size) and the params the recipe resolved for it, not the whole spec, so nobody builds a
fake spec to call one. The modifiers that cross recipes are applied here, as each task is made: a guided
recipe's stage 1 is its guided stage (`plan/guided_render.py`) and its stage 2 runs on the dev DiT with the
distilled LoRA (HQ's as res_2s guide steps), never a pass that rewrites a finished task list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from coordinator.plan.control import Reference
from coordinator.plan.graph import StageGeometry, expect, ref, task
from coordinator.plan.guidance import RES_2S, GuidedRule, GuidedStage
from coordinator.plan.guided_render import plan_guided_stage1, plan_hq_stage2
from coordinator.plan.resolved import RenderPlan
from coordinator.plan.stage2 import plan_tiled_stage2
from ltx_engine.rules.sampling import DISTILLED_SIGMAS


class RecipeStages(Protocol):
    """What a build and its windows read of the render's recipe to choose their stages (`plan/recipes/base.py`'s
    record, handed in by the build: the planner's blocks do not import the recipe registry)."""

    @property
    def guidance(self) -> GuidedRule | None: ...

    @property
    def two_stage(self) -> bool: ...

    @property
    def distilled_stage2(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Guided:
    """A guided recipe's stage: its resolved rule and the prompt's and the uncond pass's contexts."""

    stage: GuidedStage
    ctx: dict
    negative: dict


def stage1_block(rid: str, geo: StageGeometry, ctx: dict, cond: dict, images: dict, params: dict,
                 expected: dict, loras: dict, guided: Guided | None = None, track: dict | None = None,
                 reference: Reference | None = None) -> list[dict]:
    """Stage 1 at `geo` with its `images` conditioning: the distilled `denoise_stage1` with the recipe's
    `params` beside its geometry and `expected` beside its latents, or a guided recipe's guided stage (its
    prep reads the inputs); `loras`: the render's LoRA set its DiT tasks carry; `track`: A2V's encode, made
    first, its latent stage 1's frozen audio; `reference`: a control / Dub-It clip, its encodes made just
    before stage 1, which runs with its IC-LoRA and reference tokens (a gang splits them with the video's,
    `ltx_engine/parallel/sp_denoise.py`)."""
    head, cond = ([], cond) if track is None else ([track], {**cond, "audio_latent": ref(track["id"], "latent")})
    if guided is not None:
        slots = {k: params[k] for k in ("generated_slots",) if k in params}  # the guided passes carry them
        return head + plan_guided_stage1(rid, geo, guided.stage, guided.ctx, guided.negative, cond, {**images, **slots},
                                         loras, expected)
    if reference is not None:
        head += reference.tasks
        loras, cond = reference.dit(loras), {**cond, **reference.stage1}
    return head + [task(rid, "stage1", "denoise_stage1", {
        **geo.params(), "sigmas": list(DISTILLED_SIGMAS), **images, **params, **loras,
        "expect": {"video_latent": expect("float32", 1, -1, *geo.grid),
                   "audio_latent": expect("float32", 1, -1, geo.audio_frames, -1), **expected}},
        {**ctx, **cond})]


def stage_audio(rid: str, track: dict | None) -> dict:
    """The audio latent the stages after stage 1 read: A2V's frozen track, else stage 1's."""
    return ref(f"{rid}.stage1", "audio_latent") if track is None else ref(track["id"], "latent")


def upsample_block(rid: str, geo: StageGeometry) -> dict:
    """Stage 1's video latent through the spatial upsampler to `geo`'s (stage 2's) size."""
    return task(rid, "upsample", "upsample_spatial", {
        "pack": geo.pack, "expect": {"latent": expect("float32", 1, -1, *geo.grid)}},
        {"latent": ref(f"{rid}.stage1", "video_latent")})


def stage2_block(rid: str, geo: StageGeometry, spec: RenderPlan, params: dict, inputs: dict, ctx: dict,
                 expected: dict, loras: dict, guided: GuidedStage | None = None,
                 reference: Reference | None = None) -> list[dict]:
    """Stage 2 at `geo` with the recipe's `params` beside its geometry: untiled one `denoise_stage2` task,
    or TDP tiles (`spec`'s tiling), each DiT task with the render's `loras`; a guided recipe's DiT tasks on
    dev + its distilled LoRA, its untiled audio re-noised (A2V's frozen track never is), HQ's untiled stage
    as res_2s guide steps. Dub-It's `reference`: its stage-2 reference inputs and IC-LoRA (tiled: `stage2.prep`
    builds the state with both references, the cut hands the video's to the tiles, every forward runs
    with the LoRA)."""
    params = {**geo.params(), **params}
    dev = {} if guided is None else {"distilled_lora_strength": guided.stage2_lora}
    dub = reference is not None and reference.stage2 is not None
    if dub:
        inputs = {**inputs, **reference.stage2}
    if spec.stage2_tiles is not None:
        if dub:
            params, loras = {**params, "control": reference.control}, reference.dit(loras, reference=False)
        return plan_tiled_stage2(rid, spec, params, inputs, ctx, {**dev, **loras})
    loras = reference.dit(loras) if dub else loras
    renoise = {"renoise_audio": inputs["audio_latent"] == ref(f"{rid}.stage1", "audio_latent")} if dev else {}
    params |= {**dev, **renoise,
               "expect": {"video_latent": expect("float32", 1, -1, *geo.grid), **expected}}
    if guided is not None and guided.sampler == RES_2S:
        return plan_hq_stage2(rid, guided, params, {**ctx, **inputs}, ctx, loras)
    return [task(rid, "stage2", "denoise_stage2", {**params, **loras}, {**ctx, **inputs})]
