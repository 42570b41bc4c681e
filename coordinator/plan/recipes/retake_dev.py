"""The dev retake recipe: the retake's one full-size stage as a guided stage on the dev DiT.

Why one-stage: upstream's RetakePipeline (and the MLX port's `retake`, whose default is this dev path)
is one full-size stage with no upsample, so its guided variant is `--pipeline one-stage`'s guided stage
(passes in parallel, the guide steps on the coordinator) whose prepare pins the source's tokens outside
the window exactly as the distilled retake's stage does.
"""

from __future__ import annotations

from coordinator.plan.build import build_clip
from coordinator.plan.guidance import DEV_ONE_STAGE
from coordinator.plan.recipes.base import PackFacts, Recipe
from coordinator.plan.recipes.guided import guided_check
from coordinator.plan.recipes.one_stage import ONE_STAGE
from coordinator.plan.recipes.retake import SOURCE, check_retake
from coordinator.plan.resolved import RenderPlan

_GUIDED = guided_check(DEV_ONE_STAGE)


def check_retake_dev(spec: RenderPlan, pack: PackFacts) -> dict | None:
    """The retake's window rules, then the guided stage's."""
    return check_retake(spec, pack) or _GUIDED(spec, pack)


def _picked(spec: RenderPlan) -> bool:
    return bool(spec.retake)


RETAKE_DEV = Recipe(
    builds=build_clip,
    name="retake-dev",
    purpose="regenerate [start, end) seconds of a clip (and the audio over it) with CFG/STG/modality guidance "
            "on the dev DiT, each pass on its own Mac; every token outside stays the source's: one full-size stage",
    upstream="ltx-pipelines 1.0.0 RetakePipeline (`retake --video V --start S --end E`, no --distilled); the MLX "
             "port's `retake` (dev by default)",
    flag="--retake --pipeline one-stage",
    pipeline="one-stage",
    picked=_picked,
    fields=("source_video", "retake", "encode_tiles", *ONE_STAGE.fields),
    components=("text_encoder", "connector", "transformer_dev", "vae_decoder", "audio_vae", "vocoder",
                "vae_encoder"),
    check=check_retake_dev,
    two_stage=False,
    guidance=DEV_ONE_STAGE,
    distilled_stage2=False,
    dits=("transformer_dev",),
    default_spec={"pipeline": "one-stage", "source_video": SOURCE, "retake": {"start": 0.2, "end": 0.6}},
)
