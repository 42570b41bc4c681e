"""The HDR IC-LoRA render's stage graph (`--hdr-ic-lora CLIP`, LTX-2.5). Pure.

The same render as the engine's oracle (`ltx_engine.hdr_pipeline.hdr_ic_lora`), cut into farm tasks:
- `text`: the prompt's video context stands in for the MLX port's scene-embedding file;
- `source_hdr.t{i}` (`video_encode`, tiled as any source clip, `plan/media.py`) with `hdr` params: each
  worker turns its tile of the SDR clip into ACEScct working codes before the VAE encoder; the
  coordinator's `source_hdr` blend is the IC-LoRA reference latent;
- `source_guide{k}`: at every DFR seam inside the clip (keyframes on), that one frame encoded alone;
- `stage1` (`hdr_stage`): one full-size stage from noise, video only, the pack's HDR LoRA fused at 1.0,
  a generated keyframe slot and a guide (strength 0.95) per seam, the reference tokens; it carries stage 1's
  degree table (`--stage1-parallel`), so a gang splits it as it splits a distilled stage 1;
- the decode (conv, tiled or not, `plan/decode.py`; or `--video-decoder diffusion`, keyframe-aware: each
  task reads the stage's seam slots, `plan/decode_keyframes.py`, as the MLX port decodes the grade); the
  assembler turns its codes into the HLG master and the EXR frames (`coordinator/assemble/hdr_master.py`).
"""

from __future__ import annotations

from coordinator.plan.decode import Keyframes, plan_decode
from coordinator.plan.graph import SPATIAL_FACTOR, SpecError, expect, latent_frames, ref, task
from coordinator.plan.media import encode_tile_sizes, video_encode_tasks
from coordinator.plan.resolved import RenderPlan
from coordinator.plan.sp_degree import stage1_params
from ltx_engine.rules import hdr_lora
from ltx_engine.rules.components import missing_line
from ltx_engine.rules.hdr import ACESCCT
from ltx_engine.rules.sampling import DISTILLED_SIGMAS

HDR_TRANSFER = ACESCCT  # the 2.5 SDR-to-HDR LoRA's (its metadata is checked on the worker that fuses it)
HDR_EXR_DEFAULT = "acescg"  # the MLX port's default --exr-colorspace for hdr-ic-lora
SOURCE, STAGE = "source_hdr", "stage1"  # names the timeline puts under Source and Stage 1


def is_hdr(spec: RenderPlan) -> bool:
    return bool(spec.hdr_ic_lora)


def check_hdr_lora(spec: RenderPlan, has_lora: bool) -> None:
    """`--local`: this machine's pack is the fleet's; the farm's check is `_check_components` over the
    workers' `pack_components` (the LoRA is the pack's `hdr_lora` component)."""
    if is_hdr(spec) and not has_lora:
        raise SpecError(missing_line("hdr_lora", spec.pack))


def hdr_params(spec: RenderPlan) -> dict:
    """How a worker reads the SDR clip into working codes (the `hdr` params of its encode tasks)."""
    return {"transfer": HDR_TRANSFER, "input_colorspace": spec.hdr_ic_lora.input_colorspace}


def seams(spec: RenderPlan) -> tuple[int, ...]:
    return hdr_lora.seam_frames(spec.frames) if spec.hdr_ic_lora.keyframes else ()


def plan_hdr(rid: str, spec: RenderPlan, text: dict, keyframes: Keyframes | None = None) -> list[dict]:
    """The whole HDR IC-LoRA graph after its text task (see the module docstring); `keyframes`: a
    keyframe-aware decode's per-task planes (`plan/decode.plan_decode`)."""
    pack, blob = spec.pack, spec.hdr_ic_lora.blob
    frames, height, width = spec.frames, spec.height, spec.width
    h, w = height // SPATIAL_FACTOR, width // SPATIAL_FACTOR
    fps = spec.frame_rate  # the clip's frames by timestamp at the render's rate, as a retake's
    tasks, reference = video_encode_tasks(
        rid, SOURCE, pack, blob, (frames, height, width), encode_tile_sizes(spec), fps=fps
    )
    for t in tasks:
        if t["kind"] == "video_encode":
            t["params"]["hdr"] = hdr_params(spec)
    at = seams(spec)
    inputs = {"video_context": ref(text["id"], "video_context"), "reference_latent": reference}
    for k, s in enumerate(at):  # the seam frame alone, as one tile (no blend: a whole tile is its latent)
        params = {
            "pack": pack,
            "frames": 1,
            "height": height,
            "width": width,
            "first": s,
            "fps": fps,
            "pixels": [[0, 1], [0, height], [0, width]],
            "hdr": hdr_params(spec),
            "expect": {"latent": expect("float32", 1, -1, 1, h, w)},
        }
        tasks.append(task(rid, f"source_guide{k}", "video_encode", params, {"video": {"blob": blob}}))
        inputs[f"guide{k}"] = ref(tasks[-1]["id"], "latent")
    tokens = (2 * latent_frames(frames) + 2 * len(at)) * h * w  # generated, the reference, a guide and a slot per seam
    outputs = {"video_latent": expect("float32", 1, -1, latent_frames(frames), h, w)}
    if at:
        outputs["slots"] = expect("float32", 1, -1, len(at), h, w)
    tasks.append(
        task(
            rid,
            STAGE,
            "hdr_stage",
            {
                "pack": pack,
                "seed": spec.seed,
                "frames": frames,
                "height": height,
                "width": width,
                "fps": fps,
                "sigmas": list(DISTILLED_SIGMAS),
                "hdr_lora": hdr_lora.HDR_LORA_FILE,
                "transfer": HDR_TRANSFER,
                "slots": list(at),
                "keyframe_strength": hdr_lora.KEYFRAME_STRENGTH,
                "cells": tokens,  # the cost model's
                "expect": outputs,
                **stage1_params(spec, tokens, len(DISTILLED_SIGMAS) - 1),  # its gang table, as stage 1's
            },
            inputs,
        )
    )
    return [text, *tasks, *plan_decode(rid, spec, ref(f"{rid}.{STAGE}", "video_latent"), keyframes)]
