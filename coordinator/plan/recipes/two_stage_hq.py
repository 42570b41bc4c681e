"""The two-stage HQ dev recipe: res_2s in both stages, the distilled LoRA at 0.25 / 0.5."""

from __future__ import annotations

from dataclasses import replace

from coordinator.plan.recipes.two_stage import TWO_STAGE

# The two-stage recipe's flags, components, DiTs and checks; only what it is and how it is picked differ.
TWO_STAGE_HQ = replace(
    TWO_STAGE,
    name="two-stage-hq",
    purpose="the HQ dev recipe: res_2s sampling in both stages (two evaluations a step), stage 2 untiled",
    upstream="ltx-pipelines 1.0.0 TI2VidTwoStagesHQPipeline (`generate --two-stages-hq`); PIPELINES.md row 12",
    flag="--pipeline two-stage-hq",
    pipeline="two-stage-hq",
    default_spec={"pipeline": "two-stage-hq"},
)
