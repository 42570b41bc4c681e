"""The extend recipe: continue a user's clip after (or before) it, its boundary pinned."""

from __future__ import annotations

from coordinator.plan.build import build_clip
from coordinator.plan.clip import layout
from coordinator.plan.graph import SpecError, latent_frames
from coordinator.plan.recipes.base import PackFacts, Recipe
from coordinator.plan.recipes.retake import SOURCE, needs_source
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.extend import ExtendError

MAX_LATENT_FRAMES = 65  # the model's temporal range, in latent frames


def check_extend(spec: RenderPlan, pack: PackFacts) -> dict | None:
    """A window the layout can place and a clip out within the model's range; resolves the frames out."""
    needs_source(spec, "--extend")
    try:
        out = layout(spec).output_frames
    except ExtendError as exc:
        raise SpecError(f"--extend: {exc} (-f)") from None
    if latent_frames(out) > MAX_LATENT_FRAMES:
        raise SpecError(f"--extend: {out} frames out is past the model's range")
    return {"output_frames": out}


def _picked(spec: RenderPlan) -> bool:
    return bool(spec.extend)


EXTEND = Recipe(
    builds=build_clip,
    name="extend",
    purpose="add 8N frames after (or before) a clip: its 25 boundary frames and their audio pinned, distilled 8+3 "
            "steps, the whole clip decoded once",
    upstream="the MLX port's `extend --video V --extend-frames N --distilled` (upstream chunks: 1.4.0); "
             "PIPELINES.md row 6",
    flag="--extend",
    picked=_picked,
    fields=("source_video", "extend", "encode_tiles"),
    components=("text_encoder", "connector", "transformer", "spatial_upscaler", "vae_decoder", "audio_vae", "vocoder",
                "vae_encoder"),
    check=check_extend,
    default_spec={"source_video": SOURCE, "extend": {"frames": 1}},
)
