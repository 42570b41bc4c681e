"""The media pipelines run whole in one process from already-encoded latents: the oracle a farm graph of
encode / denoise / upsample tasks must equal bit for bit (each call here is one of the engine's task ops).

- retake: one full-resolution stage (distilled sigmas, Euler, as upstream 1.0.0's distilled retake) from
  the source's latents with the window masks;
- extend: the distilled two-stage graph on a window of 4 + N latent frames, the source's re-encoded 25
  boundary frames pinned in both stages (half and full size) and their audio in stage 1 (stage 2 keeps
  stage 1's audio frozen), then the window joined to the source's latents (`extend.assemble_*`);
- IC-LoRA control: stage 1 on the pack with the IC-LoRA(s) fused and the control reference (encoded at
  the half size over the downscale), stage 2 on the plain pack without it (upstream's clean stage 2);
- Dub-It: both stages on the pack with the Dub-It LoRA fused, the reference video in each (its own size),
  stage 1's audio reference the source's audio, stage 2's stage 1's audio (also kept frozen).
Video latents come out at full size; the audio is stage 1's (what the decode reads). Stage 2 keeps the
audio frozen as the farm's distilled stage 2 does (upstream from v1.4 `freeze_audio`); 1.0.0's
`ICLoraPipeline` re-noised it from sigma 0.909 in stage 2, Dub-It (1.2) freezes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from ltx_engine.denoise import StageInputs
from ltx_engine.media_stage import extend_context
from ltx_engine.rules import extend
from ltx_engine.rules.generation import stage1_sampler
from ltx_engine.rules.ic_lora import ControlReference
from ltx_engine.rules.retake import RetakeWindow
from ltx_engine.rules.sampling import DISTILLED_SIGMAS, EULER, STAGE_2_DISTILLED_SIGMAS


@dataclass(frozen=True)
class Render:
    """What every stage of a render shares (the full-resolution size; stage 1 runs at half of it)."""

    frames: int
    height: int
    width: int
    fps: float
    seed: int
    contexts: dict
    audio_frames: int

    def stage(self, half: bool, **extra) -> StageInputs:
        shared = {f.name: getattr(self, f.name) for f in fields(self)}
        if half:
            shared |= {"height": self.height // 2, "width": self.width // 2}
        return StageInputs(**shared, **extra)


def retake(
    engine, pack, render: Render, video: np.ndarray, audio: np.ndarray | None, window: RetakeWindow
) -> dict:
    """One full-size stage over the source's latents; the window regenerated, the rest kept exactly."""
    inputs = render.stage(
        False,
        sigmas=list(DISTILLED_SIGMAS),
        initial_video=video,
        initial_audio=audio,
        retake=window,
        sampler=EULER,
    )
    return engine.denoise_stage1(pack, inputs)


def two_stage(engine, packs: tuple, render: Render, stage1: dict, stage2: Callable[[dict], dict]) -> dict:
    """Stage 1 at half size on packs[0] → spatial x2 → stage 2 on packs[1] with stage 1's audio frozen;
    `stage2(stage-1 outputs)` gives stage 2's extra fields."""
    sampler = stage1_sampler(packs[0].generation, False)
    s1 = engine.denoise_stage1(
        packs[0], render.stage(True, sigmas=list(DISTILLED_SIGMAS), sampler=sampler, **stage1)
    )
    upsampled = engine.upsample_spatial(packs[1], s1["video_latent"])
    inputs = render.stage(
        False,
        sigmas=list(STAGE_2_DISTILLED_SIGMAS),
        initial_video=upsampled,
        initial_audio=s1["audio_latent"],
        noise_stream=1,
        **stage2(s1),
    )
    return {
        "video_latent": engine.denoise_stage2(packs[1], inputs)["video_latent"],
        "audio_latent": s1["audio_latent"],
    }


def extend_window(
    engine,
    pack,
    render: Render,
    layout: extend.ExtendLayout,
    context_half: np.ndarray,
    context_full: np.ndarray,
    audio_pin: np.ndarray | None,
) -> dict:
    """The window (4 + N latent frames, `render.frames` = layout.window_frames) with the context pinned."""
    stage1 = {"images": (extend_context(layout, context_half),)}
    if audio_pin is not None:
        stage1 |= {"audio_pin": audio_pin, "audio_pin_start": layout.audio_pin_start}
    return two_stage(
        engine, (pack, pack), render, stage1, lambda _: {"images": (extend_context(layout, context_full),)}
    )


def extend_clip(
    layout: extend.ExtendLayout, source_video: np.ndarray, source_audio: np.ndarray, window: dict
) -> dict:
    """The whole extended clip's latents (source + new), decoded once."""
    return {
        "video_latent": extend.assemble_video(layout, source_video, window["video_latent"]),
        "audio_latent": extend.assemble_audio(layout, source_audio, window["audio_latent"]),
    }


def ic_lora_control(engine, fused_pack, plain_pack, render: Render, control: ControlReference) -> dict:
    """Stage 1 with the IC-LoRA(s) fused and the control reference; a clean stage 2 on the plain DiT."""
    return two_stage(engine, (fused_pack, plain_pack), render, {"control": control}, lambda _: {})


def dubit(
    engine,
    fused_pack,
    render: Render,
    reference_half: ControlReference,
    reference_full: ControlReference,
    reference_audio: np.ndarray,
) -> dict:
    """Dub-It: the reference video in both stages, the source's audio then stage 1's as audio reference."""
    stage1 = {"control": reference_half, "audio_reference": reference_audio}
    return two_stage(
        engine,
        (fused_pack, fused_pack),
        render,
        stage1,
        lambda s1: {"control": reference_full, "audio_reference": s1["audio_latent"]},
    )
