"""The two-stage HQ dev recipe: res_2s in both stages, the distilled LoRA at 0.25 / 0.5."""

from __future__ import annotations

from dataclasses import replace

from coordinator.plan.guidance import HQ
from coordinator.plan.recipes.guided import guided_check
from coordinator.plan.recipes.two_stage import TWO_STAGE

# The two-stage recipe's flags, components and DiTs; what it is, how it is picked and its rule (res_2s, its
# guider defaults and LoRA strengths) differ.
TWO_STAGE_HQ = replace(
    TWO_STAGE,
    name="two-stage-hq",
    purpose="the HQ dev recipe: res_2s sampling in both stages (two evaluations a step), stage 2 untiled",
    upstream="ltx-pipelines 1.0.0 TI2VidTwoStagesHQPipeline (`generate --two-stages-hq`); PIPELINES.md row 12",
    flag="--pipeline two-stage-hq",
    pipeline="two-stage-hq",
    check=guided_check(HQ),
    guidance=HQ,
    default_spec={"pipeline": "two-stage-hq"},
)
