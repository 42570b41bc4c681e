"""The distilled recipe: the farm's default render. Data only: its rules are the modifiers'."""

from __future__ import annotations

from coordinator.plan.build import build_video
from coordinator.plan.recipes.base import Recipe

DISTILLED = Recipe(
    builds=build_video,
    name="distilled",
    purpose="text/image to video with audio: the distilled DiT, 8 steps at half size, upsample, 3 at full size",
    upstream="ltx-pipelines 1.0.0 DistilledPipeline (`generate --distilled` in ltx-2-mlx); PIPELINES.md row 1",
    flag="--pipeline distilled",
    fields=("prompt", "height", "width", "frames", "frame_rate", "seed", "pack"),
    components=("text_encoder", "connector", "transformer", "spatial_upscaler", "vae_decoder", "audio_vae", "vocoder"),
)
