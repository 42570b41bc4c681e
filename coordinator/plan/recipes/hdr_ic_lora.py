"""The HDR IC-LoRA recipe (LTX-2.5): an SDR clip graded to HDR, video only (`plan/hdr.py` plans it)."""

from __future__ import annotations

from coordinator.plan.build import build_hdr
from coordinator.plan.graph import SpecError
from coordinator.plan.media import encode_tile_sizes
from coordinator.plan.recipes.base import PackFacts, Recipe
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules import hdr_lora

CLIP = {"blob": "0" * 64, "name": "sdr.mp4"}  # the default spec's stand-in (planning needs no file)


def check_hdr(spec: RenderPlan, pack: PackFacts) -> dict | None:
    """A pack known to be LTX-2.5 (its HDR LoRA is 2.5-only), video only, encode tiles upstream takes."""
    name = spec.hdr_ic_lora.name or "the clip"
    if pack.generation is None:
        raise SpecError(
            f"--hdr-ic-lora {name}: pack {pack.name!r} is not known to be LTX-2.5 "
            "(no registered worker describes it)"
        )
    try:
        hdr_lora.refuse_pack(pack.generation, pack.name)
    except hdr_lora.HdrRefusal as exc:
        raise SpecError(str(exc)) from None
    if spec.audio:
        raise SpecError(f"--hdr-ic-lora {name} renders video only: give --no-audio")
    encode_tile_sizes(spec)
    return None


def _picked(spec: RenderPlan) -> bool:
    return bool(spec.hdr_ic_lora)


HDR_IC_LORA = Recipe(
    builds=build_hdr,
    name="hdr-ic-lora",
    purpose="an SDR clip graded to HDR: ACEScct codes encoded in tiles, one 8-step stage with the pack's HDR LoRA "
            "and seam keyframes, then an HLG master and ACEScg EXR",
    upstream="ltx-pipelines 1.2.0 HDRICLoraPipeline (single-stage ACEScct: 1.4.0; `hdr-ic-lora --input`); "
             "PIPELINES.md row 8",
    flag="--hdr-ic-lora",
    picked=_picked,
    fields=("hdr_ic_lora", "encode_tiles", "exr", "exr_colorspace"),
    components=("text_encoder", "connector", "transformer", "vae_encoder", "vae_decoder", "hdr_lora"),
    check=check_hdr,
    two_stage=False,
    default_spec={"hdr_ic_lora": CLIP, "audio": False},
)
