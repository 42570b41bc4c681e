"""The DFR recipe (LTX-2.5): the distilled stages on a padded canvas with keyframe slots, then
temporal rounds, the spatial epilogue and a keyframe-aware decode as asked.

Its rules (canvas length, the pack's features, the epilogue's sizes, the detailing LoRA) stay in
`plan/dfr.py`: IC-LoRA control and Dub-It take `--dfr` too, so they are DFR's rules, not this recipe's.
"""

from __future__ import annotations

from coordinator.plan.build import build_video
from coordinator.plan.dfr import dfr_on
from coordinator.plan.recipes.base import Recipe
from coordinator.plan.resolved import RenderPlan


def _picked(spec: RenderPlan) -> bool:
    return dfr_on(spec)


DFR = Recipe(
    builds=build_video,
    name="dfr",
    purpose="LTX-2.5 long renders: stages on a padded canvas with keyframe slots, temporal rounds x2 in time "
            "(tiles chained, each pinned on the one before), an optional x2 spatial epilogue",
    upstream="ltx-pipelines 1.2.0 DFRPipeline (epilogue: 1.3.0; `generate --dfr`); PIPELINES.md rows 13, 35, 36",
    flag="--dfr",
    picked=_picked,
    fields=("dfr", "temporal_upscalings", "spatial_upscalings", "detailing_lora", "detailing_strength"),
    components=("text_encoder", "connector", "transformer", "spatial_upscaler", "vae_decoder", "audio_vae", "vocoder"),
    default_spec={"dfr": True},
)
