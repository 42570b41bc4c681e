"""The dev extend recipe: the extend's two stages as the two-stage dev recipe's.

Why two-stage: the farm's extend pins the clip's boundary at half size in stage 1 and at full size in
stage 2 (`media_pipelines.extend_window`), so its dev variant is `--pipeline two-stage`'s stages: a guided
stage 1 (passes in parallel, guide steps on the coordinator) whose prepare pins the same context and
boundary audio, then stage 2 on the dev DiT + the distilled LoRA, the join and the one decode as before.
"""

from __future__ import annotations

from coordinator.plan.build import build_clip
from coordinator.plan.guidance import DEV
from coordinator.plan.recipes.base import PackFacts, Recipe
from coordinator.plan.recipes.extend import check_extend
from coordinator.plan.recipes.guided import TWO_STAGE_DITS, TWO_STAGE_FIELDS, guided_check
from coordinator.plan.recipes.retake import SOURCE
from coordinator.plan.resolved import RenderPlan

_GUIDED = guided_check(DEV)


def check_extend_dev(spec: RenderPlan, pack: PackFacts) -> dict | None:
    """The extend's window rules (what they resolve), then the guided stage's."""
    resolved = check_extend(spec, pack)
    _GUIDED(spec, pack)
    return resolved


def _picked(spec: RenderPlan) -> bool:
    return bool(spec.extend)


EXTEND_DEV = Recipe(
    builds=build_clip,
    name="extend-dev",
    purpose="add 8N frames after (or before) a clip, its 25 boundary frames and their audio pinned: a guided dev "
            "stage 1 (each pass on its own Mac), stage 2 on dev + the distilled LoRA, the whole clip decoded once",
    upstream="the MLX port's `extend --video V --extend-frames N` (dev by default, one stage over the whole clip; "
             "ours: the distilled extend's window, two-stage dev)",
    flag="--extend --pipeline two-stage",
    pipeline="two-stage",
    picked=_picked,
    fields=("source_video", "extend", "encode_tiles", *TWO_STAGE_FIELDS),
    components=("text_encoder", "connector", "transformer_dev", "distilled_lora", "spatial_upscaler", "vae_decoder",
                "audio_vae", "vocoder", "vae_encoder"),
    check=check_extend_dev,
    guidance=DEV,
    distilled_stage2=False,
    dits=TWO_STAGE_DITS,
    default_spec={"pipeline": "two-stage", "source_video": SOURCE, "extend": {"frames": 1}},
)
