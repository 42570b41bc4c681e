"""The IC-LoRA control recipe: a control clip (depth, canny, pose …) as reference tokens in stage 1."""

from __future__ import annotations

from coordinator.plan.build import build_video
from coordinator.plan.control import check_reference
from coordinator.plan.graph import SpecError
from coordinator.plan.recipes.base import PackFacts, Recipe
from coordinator.plan.resolved import RenderPlan

CLIP = {"blob": "0" * 64, "name": "control.mp4"}  # the default spec's stand-ins (planning needs no file)
LORA = {"blob": "1" * 64, "name": "ic.safetensors", "strength": 1.0, "downscale": 1}


def check_control(spec: RenderPlan, pack: PackFacts) -> dict | None:
    """Its IC-LoRA, the clip's encode tiles, a reference the VAE encodes at each stage that takes it
    (`plan/control.py`); a tiled stage 2 builds no self-attention mask, so it takes the control at full
    attention alone."""
    name = check_reference(spec, "control_video", "--control-video")
    clip = spec.control_video
    if clip.stage2 and spec.stage2_tiles is not None:
        masked = ("--control-mask" if spec.control_mask else
                  f"--control-attention {clip.attention_strength:g}" if clip.attention_strength < 1.0 else None)
        if masked:
            raise SpecError(
                f"--control-video {name}: --control-stage2 with {masked} needs an untiled stage 2 (its tiles "
                f"carry no self-attention mask): drop --stage2-tiles, or {masked.split()[0]}"
            )
    return None


def _picked(spec: RenderPlan) -> bool:
    return bool(spec.control_video)


IC_LORA = Recipe(
    builds=build_video,
    name="ic-lora",
    purpose="IC-LoRA control: the control clip encoded at stage 1's size over the LoRA's downscale, the IC-LoRA "
            "fused in stage 1 with its reference tokens, a clean stage 2 (with --control-stage2: the control at "
            "full size and the IC-LoRA there too)",
    upstream="ltx-pipelines 1.0.0 ICLoraPipeline (`ic-lora --video-conditioning V S`); PIPELINES.md row 7; "
             "--control-stage2: the MLX port's `ic-lora --upsample-only --refine-steps 3`",
    flag="--control-video",
    picked=_picked,
    fields=("control_video", "control_mask", "ic_lora", "encode_tiles"),
    components=("text_encoder", "connector", "transformer", "spatial_upscaler", "vae_decoder", "audio_vae", "vocoder"),
    check=check_control,
    default_spec={"control_video": CLIP, "ic_lora": LORA},
)
