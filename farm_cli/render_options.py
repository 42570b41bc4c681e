"""The render options, written once for the three commands that take them (`render`, `submit`, `plan`).

Why: each command used to spell every option in its own signature and its own `cli_spec` call, so a
feature had to add its flags three times, and the three drifted (`submit` lacked `--stage1-steps`,
`plan` lacked `--detailing-lora`). `@render_options` appends the table below to a command's signature
(typer reads `__signature__`), the command takes them as `**asked`, and `asked_render` turns them into
the typed spec plus the client files to upload. A new render flag is one row here and one line in
`asked_render`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from farm_cli import options as opt
from farm_cli.options import SPEC
from protos.spec import RenderSpec

# (name, annotation, default), in the order `--help` lists them.
RENDER_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("prompt", opt.Prompt, ""), ("height", opt.Height, SPEC.height), ("width", opt.Width, SPEC.width),
    ("frames", opt.Frames, None), ("frame_rate", opt.FrameRate, SPEC.frame_rate), ("seed", opt.Seed, SPEC.seed),
    ("pack", opt.PackRef, SPEC.pack), ("image", opt.Image, None), ("image_binding", opt.ImageBinding, None),
    ("image_crf", opt.ImageCrf, None), ("num_generated_keyframes", opt.GeneratedKeyframes, 0),
    ("no_audio", opt.NoAudio, False), ("stage2_tiles", opt.Stage2Tiles, None),
    ("tile_overlap", opt.TileOverlap, SPEC.tile_overlap), ("stage2_sigmas", opt.Stage2Sigmas, None),
    ("temporal_upscalings", opt.TemporalUpscalings, SPEC.temporal_upscalings),
    ("decode_tiles", opt.DecodeTiles, SPEC.decode_tiles), ("exr", opt.Exr, None),
    ("text_encoder", opt.TextEncoder, None),
    ("sparse_attention", opt.SparseAttention, None), ("compute_dtype", opt.ComputeDtype, None),  # issue #26
    ("stage1_parallel", opt.Stage1Parallel, None),  # issue #25
    ("detailing_lora", opt.DetailingLora, None), ("detailing_strength", opt.DetailingStrength, SPEC.detailing_strength),
    ("lora", opt.Lora, None), ("lora_mode", opt.LoraMode, SPEC.lora_mode),  # issue #22
    ("pipeline", opt.Pipeline, SPEC.pipeline), ("steps", opt.Steps, None),  # issue #23: the guided recipes
    ("stage1_steps", opt.Stage1Steps, None), ("stage2_steps", opt.Stage2Steps, None),
    ("cfg_scale", opt.CfgScale, None), ("stg_scale", opt.StgScale, None), ("stg_blocks", opt.StgBlocks, None),
    ("rescale", opt.Rescale, None), ("modality_scale", opt.ModalityScale, None),
    ("audio_cfg_scale", opt.AudioCfgScale, None), ("audio_stg_scale", opt.AudioStgScale, None),
    ("audio_rescale", opt.AudioRescale, None), ("audio_modality_scale", opt.AudioModalityScale, None),
    ("negative_prompt", opt.NegativePrompt, None),
    ("exr_colorspace", opt.ExrColorspace, None), ("auto_duration", opt.AutoDuration, None),  # issue #29
    ("hdr", opt.Hdr, False), ("video_decoder", opt.VideoDecoder, None),
    ("dfr", opt.Dfr, False), ("spatial_upscalings", opt.SpatialUpscalings, 1),
    ("audio", opt.Audio, None), ("audio_start", opt.AudioStart, None),  # issue #24: media in
    ("control_video", opt.ControlVideoOpt, None), ("control_attention", opt.ControlAttention, None),
    ("ic_lora", opt.IcLoraOpt, None), ("dub", opt.Dub, None),  # issue #24: IC-LoRA control, Dub-It
    ("encode_tiles", opt.EncodeTiles, None),  # issue #24: the clips' tiled video_encode
    ("retake", opt.Retake, None), ("start", opt.Start, None), ("end", opt.End, None),  # issue #24 retake/extend
    ("no_regen_audio", opt.NoRegenAudio, False), ("extend", opt.Extend, None),
    ("extend_frames", opt.ExtendFrames, None), ("direction", opt.Direction, None),
    ("hdr_ic_lora", opt.HdrIcLora, None), ("no_keyframes", opt.NoKeyframes, False),  # issue #29: HDR IC-LoRA
    ("input_colorspace", opt.InputColorspace, None),
)


def render_options(command: Callable) -> Callable:
    """The command with every render option appended to its signature (keyword-only; typer builds the
    options from it); the command receives them in its `**asked`."""
    own = inspect.signature(command, eval_str=True)
    kept = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    names = {p.name for p in kept}
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
             for name, annotation, default in RENDER_OPTIONS if name not in names]
    command.__signature__ = own.replace(parameters=kept + added)
    return command


@dataclass
class AskedRender:
    """What the options ask for: the typed spec, the decoded images, and the client files behind the
    spec's blobs (LoRAs, media) that a farm command uploads and `--local` reads where they are."""

    spec: RenderSpec
    pixels: list[np.ndarray]
    lora_files: dict[str, Path] = field(default_factory=dict)
    media_files: dict[str, Path] = field(default_factory=dict)

    def upload_to(self, coordinator: str, token: str | None) -> None:
        from farm_cli import loras, media

        loras.upload_to(self.lora_files, coordinator, token)
        media.upload_to(self.media_files, coordinator, token)


def asked_render(asked: dict, *, data: Path | None = None, priority: int | None = None, notify: str | None = None,
                 planning: bool = False) -> AskedRender:
    """The render the options ask for; one line, exit 2, for anything the spec refuses. `planning`
    (`farm plan`): images are not decoded (each file's sha256 stands in for its blob)."""
    from farm_cli import loras, media
    from farm_cli.hdr_spec import decoder_fields, dfr_fields, hdr_fields
    from farm_cli.spec import cli_spec

    a = asked
    user_loras, user_media = loras.resolve(a["lora"], a["lora_mode"]), media.resolve(a["audio"], a["audio_start"])
    media.add_control(user_media, a["control_video"], a["control_attention"], a["ic_lora"], a["dub"])
    user_media.fields |= {"encode_tiles": a["encode_tiles"]} if a["encode_tiles"] else {}
    media.resolve_clip(user_media, a)  # issue #24 retake/extend
    media.add_hdr_clip(user_media, a["hdr_ic_lora"], a["no_keyframes"], a["input_colorspace"])  # issue #29
    guidance = opt.guidance_fields(
        a["pipeline"], a["steps"], a["cfg_scale"], a["stg_scale"], a["stg_blocks"], a["rescale"], a["modality_scale"],
        a["audio_cfg_scale"], a["audio_stg_scale"], a["audio_rescale"], a["audio_modality_scale"],
        a["negative_prompt"]) | {"stage1_steps": a["stage1_steps"], "stage2_steps": a["stage2_steps"]}
    spec, pixels = cli_spec(
        prompt=a["prompt"] or ("plan" if planning else ""), height=a["height"], width=a["width"],
        frames=a["frames"], frame_rate=a["frame_rate"], seed=a["seed"], pack=a["pack"], image=a["image"],
        image_binding=a["image_binding"], image_crf=a["image_crf"],
        num_generated_keyframes=a["num_generated_keyframes"], no_audio=a["no_audio"],
        stage2_tiles=a["stage2_tiles"], tile_overlap=a["tile_overlap"], stage2_sigmas=a["stage2_sigmas"],
        temporal_upscalings=a["temporal_upscalings"], decode_tiles=a["decode_tiles"], exr=a["exr"],
        text_encoder=a["text_encoder"], data=data, detailing_lora=a["detailing_lora"],
        detailing_strength=a["detailing_strength"], priority=priority, notify=notify,
        image_blob="plan" if planning else None, lora_fields=user_loras.fields, guidance=guidance,
        sparse_attention=a["sparse_attention"], compute_dtype=a["compute_dtype"],
        stage1_parallel=a["stage1_parallel"],
        hdr_fields=hdr_fields(a["exr_colorspace"], a["auto_duration"], a["hdr"]) | decoder_fields(a["video_decoder"]),
        dfr_fields=dfr_fields(a["dfr"], a["spatial_upscalings"]), media_fields=user_media.fields)
    return AskedRender(spec, pixels, user_loras.files, user_media.files)
