"""The Dub-It recipe: a reference clip's picture and voice in both stages, with its IC-LoRA."""

from __future__ import annotations

from coordinator.plan.build import build_video
from coordinator.plan.control import check_reference
from coordinator.plan.graph import SpecError
from coordinator.plan.recipes.base import PackFacts, Recipe
from coordinator.plan.recipes.ic_lora import LORA
from coordinator.plan.resolved import RenderPlan

CLIP = {"blob": "0" * 64, "name": "talk.mp4"}  # the default spec's stand-in (planning needs no file)


def check_dub(spec: RenderPlan, pack: PackFacts) -> dict | None:
    """As control's, and the audio kept: Dub-It generates the voice."""
    name = check_reference(spec, "dub_video", "--dub")
    if not spec.audio:
        raise SpecError(f"--dub {name}: Dub-It generates the audio; drop --no-audio")
    return None


def _picked(spec: RenderPlan) -> bool:
    return bool(spec.dub_video)


DUB_IT = Recipe(
    builds=build_video,
    name="dub-it",
    purpose="Dub-It (LipDub): the reference clip encoded at each stage's size, its track as stage 1's audio "
            "reference, the LoRA in both stages",
    upstream="ltx-pipelines 1.2.0 DubItPipeline (`lipdub --reference-video V --lora P S`); PIPELINES.md row 9",
    flag="--dub",
    picked=_picked,
    fields=("dub_video", "ic_lora", "encode_tiles"),
    components=("text_encoder", "connector", "transformer", "spatial_upscaler", "vae_decoder", "audio_vae", "vocoder"),
    check=check_dub,
    default_spec={"dub_video": CLIP, "ic_lora": LORA},
)
