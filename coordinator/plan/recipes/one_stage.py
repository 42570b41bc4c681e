"""The one-stage dev recipe: guided passes at full size, no stage 2."""

from __future__ import annotations

from coordinator.plan.build import build_video
from coordinator.plan.guidance import DEV_ONE_STAGE
from coordinator.plan.recipes.base import Recipe
from coordinator.plan.recipes.guided import guided_check

ONE_STAGE = Recipe(
    builds=build_video,
    name="one-stage",
    purpose="the dev DiT at full size with CFG/STG/modality guidance, each pass on its own Mac; no upsample",
    upstream="ltx-pipelines 1.0.0 TI2VidOneStagePipeline (`generate --one-stage`); PIPELINES.md row 10",
    flag="--pipeline one-stage",
    pipeline="one-stage",
    fields=("steps", "cfg_scale", "stg_scale", "stg_blocks", "rescale", "modality_scale", "negative_prompt"),
    components=("text_encoder", "connector", "transformer_dev", "vae_decoder", "audio_vae", "vocoder"),
    check=guided_check(DEV_ONE_STAGE),
    two_stage=False,
    guidance=DEV_ONE_STAGE,
    distilled_stage2=False,
    dits=("transformer_dev",),
    default_spec={"pipeline": "one-stage"},
)
