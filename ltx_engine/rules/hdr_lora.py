"""The HDR IC-LoRA's rules outside the model: its metadata, the refusals, DFR seam roles, the conditioning
fps. Pure (safetensors headers only): the coordinator can call the refusals at submit. The scene
embedding's loader is `hdr_pipeline.load_video_context`, the tiny LoRA's writer `tiny_hdr_lora`.

As upstream (`ltx_pipelines.hdr_ic_lora.read_hdr_lora_config`, main) and the MLX port (`hdr_ic_lora.py`):
- a LoRA is an HDR LoRA when its metadata has `hdr_transform` (a transfer name, or "true") or
  `use_hdr_transform`; a bare flag means LogC3 (1.2.0's 2.3 LoRA); `reference_downscale_factor`
  defaults to 1 (the 2.5 SDR-to-HDR LoRA reads the SDR clip at full size);
- the LoRA is fused at strength 1.0; the pack must be LTX-2.5 (keyframe position embedding);
- with keyframes (the default, strength 0.95), every DFR seam inside the clip (`resolve_canvas` slots
  < frames, doubled under --high-quality) is both a generated slot and a one-frame SDR guide;
- the RoPE fps snaps to 30 above 30 fps (DFR snaps to 60).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ltx_engine.rules.hdr import LOGC3, TRANSFERS

HDR_LORA_REPO = "Lightricks/LTX-2.5-22b-IC-LoRA-SDR-To-HDR"
HDR_LORA_FILE = "ltx-2.5-22b-ic-lora-sdr-to-hdr-1.0.safetensors"  # also the tiny 2.5 pack's file name
HDR_LORA_STRENGTH = 1.0
KEYFRAME_STRENGTH = 0.95
SNAP_FPS_ABOVE, SNAPPED_FPS = 30.0, 30.0


class HdrRefusal(ValueError):
    """An HDR IC-LoRA render the farm refuses at submit (one line, naming what is missing and how to get it)."""


@dataclass(frozen=True)
class HdrLoraConfig:
    transfer: str = LOGC3
    downscale: int = 1


def read_hdr_lora_config(path: str | Path) -> HdrLoraConfig | None:
    """The LoRA's HDR settings from its safetensors metadata, or None when it is not an HDR LoRA."""
    from ltx_engine.rules.safetensors_header import read_raw_header

    metadata = read_raw_header(path, error=HdrRefusal)[1].get("__metadata__") or {}
    raw = str(metadata.get("hdr_transform", "") or "")
    if not (raw or metadata.get("use_hdr_transform")):
        return None
    transfer = raw if raw and raw != "true" else LOGC3
    if transfer not in TRANSFERS:
        raise HdrRefusal(f"{path}: hdr_transform {transfer!r} is not one of {', '.join(TRANSFERS)}")
    scale = str(metadata.get("reference_downscale_factor", "1"))
    if not scale.isdigit() or int(scale) < 1:
        raise HdrRefusal(f"{path}: reference_downscale_factor {scale!r} is not a whole number >= 1")
    return HdrLoraConfig(transfer, int(scale))


def refuse_pack(generation: str, pack_name: str) -> None:
    """HDR IC-LoRA on anything but an LTX-2.5 pack (the LoRA and the seam keyframes need 2.5's DiT)."""
    if generation != "2.5":
        raise HdrRefusal(
            f"hdr-ic-lora needs an LTX-2.5 pack; {pack_name!r} is LTX-{generation} "
            "(the SDR-to-HDR IC-LoRA is 2.5-only): pass --pack with a 2.5 pack"
        )


def refuse_lora(path: str | Path | None) -> HdrLoraConfig:
    """The HDR LoRA file must exist and carry HDR metadata; the line says how to download it."""
    fetch = f"hf download {HDR_LORA_REPO} {HDR_LORA_FILE} (a gated repo: accept its licence first)"
    if path is None or not Path(path).is_file():
        raise HdrRefusal(
            f"the HDR IC-LoRA file {str(path or HDR_LORA_FILE)!r} is missing: get it with {fetch}"
        )
    config = read_hdr_lora_config(path)
    if config is None:
        raise HdrRefusal(
            f"{path}: not an HDR IC-LoRA (no hdr_transform in its metadata); the 2.5 one: {fetch}"
        )
    return config


def refuse_frames(frames: int) -> None:
    if frames < 1 or (frames - 1) % 8:
        snapped = max(1, (frames - 1) // 8 * 8 + 1)
        raise HdrRefusal(
            f"an HDR IC-LoRA source must have 8k+1 frames; it has {frames}: trim it to {snapped}"
        )


def conditioning_fps(fps: float) -> float:
    return SNAPPED_FPS if fps > SNAP_FPS_ABOVE else float(fps)


def seam_frames(frames: int, high_quality: bool = False) -> tuple[int, ...]:
    """DFR seams inside a clip of `frames` source frames (pixel indices of the generated clip)."""
    from ltx_engine.rules.dfr_layout import resolve_canvas

    if frames < 2:
        return ()
    seams = [s for s in resolve_canvas(frames).slots if s < frames]
    return tuple(2 * s for s in seams) if high_quality else tuple(seams)
