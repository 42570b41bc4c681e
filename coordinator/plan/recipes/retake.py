"""The retake recipe: regenerate a window of a user's clip, the rest pinned (one full-size stage)."""

from __future__ import annotations

import math

from coordinator.plan.build import build_clip
from coordinator.plan.graph import SpecError
from coordinator.plan.recipes.base import PackFacts, Recipe
from coordinator.plan.resolved import RenderPlan

SOURCE = {"blob": "0" * 64, "name": "clip.mp4"}  # the default spec's stand-in clip (planning needs no file)


def needs_source(spec: RenderPlan, flag: str) -> None:
    """Retake and extend start from a clip: the spec names it (the CLI uploads it as `source_video`)."""
    if not spec.source_video:
        raise SpecError(f"{flag} names no source video")


def check_retake(spec: RenderPlan, pack: PackFacts) -> dict | None:
    """The window ends inside the render; when it does not, the line says what helps: an earlier --end,
    and a larger -f only where -f was given (left out, the render already takes the whole clip)."""
    needs_source(spec, "--retake")
    frames, fps = spec.frames, spec.frame_rate
    end, length = spec.retake.end, frames / fps
    if end <= length + 1e-6:
        return None
    asked = spec.spec.frames  # the asked length, not the clip's
    more = ("a larger -f (up to the clip's length)" if asked is not None
            else "a longer clip (the render already takes every frame of this one)")
    raise SpecError(
        f"--retake: --end {end:g} s is past the render's {frames} frames ({length:.2f} s at {fps:g} fps): "
        f"give --end {math.floor(length * 100) / 100:g} or less, or {more}"
    )


def _picked(spec: RenderPlan) -> bool:
    return bool(spec.retake)


RETAKE = Recipe(
    builds=build_clip,
    name="retake",
    purpose="regenerate [start, end) seconds of a clip (and the audio over it); every token outside stays the "
            "source's: one full-size distilled stage",
    upstream="ltx-pipelines 1.0.0 RetakePipeline (`retake --video V --start S --end E --distilled`); PIPELINES.md row 5",
    flag="--retake",
    picked=_picked,
    fields=("source_video", "retake", "encode_tiles"),
    components=("text_encoder", "connector", "transformer", "spatial_upscaler", "vae_decoder", "audio_vae", "vocoder",
                "vae_encoder"),
    check=check_retake,
    two_stage=False,
    default_spec={"source_video": SOURCE, "retake": {"start": 0.2, "end": 0.6}},
)
