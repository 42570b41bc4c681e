"""The two-stage dev recipe: a guided half-size stage 1, then stage 2 on dev + the distilled LoRA."""

from __future__ import annotations

from coordinator.plan.build import build_video
from coordinator.plan.guidance import DEV
from coordinator.plan.recipes.base import Recipe
from coordinator.plan.recipes.guided import (
    TWO_STAGE_COMPONENTS,
    TWO_STAGE_DITS,
    TWO_STAGE_FIELDS,
    guided_check,
)

TWO_STAGE = Recipe(
    builds=build_video,
    name="two-stage",
    purpose="guided dev stage 1 at half size, upsample, stage 2 on the dev DiT + distilled LoRA (tileable)",
    upstream="ltx-pipelines 1.0.0 TI2VidTwoStagesPipeline (`generate --two-stage`); PIPELINES.md row 11",
    flag="--pipeline two-stage",
    pipeline="two-stage",
    fields=TWO_STAGE_FIELDS,
    components=TWO_STAGE_COMPONENTS,
    check=guided_check(DEV),
    guidance=DEV,
    distilled_stage2=False,
    dits=TWO_STAGE_DITS,
    default_spec={"pipeline": "two-stage"},
)
