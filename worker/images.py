"""A stage task's images as the engine takes them, from the params the planner wrote
(`coordinator/plan/images.py`: `images` = [{frame, strength, binding, input}], one latent input each)."""

from __future__ import annotations

import numpy as np

from ltx_engine.conditioning import ImageCondition
from ltx_engine.rules.keyframes import default_crf


def stage_images(params: dict, inputs: dict[str, np.ndarray]) -> tuple[ImageCondition, ...]:
    """The stage's image conditions, in the spec's order (frames already resolved against the clip)."""
    return tuple(ImageCondition(latent=inputs[im["input"]], frame=int(im["frame"]), strength=float(im["strength"]),
                                binding=str(im["binding"]), name=f"image {im['input']}")
                 for im in params.get("images") or ())


def dfr_images(params: dict, inputs: dict[str, np.ndarray]) -> tuple[tuple[np.ndarray, int, float], ...]:
    """A DFR tile's images (those in its window): (latent, pixel frame, strength) each."""
    return tuple((inputs[im["input"]], int(im["frame"]), float(im["strength"])) for im in params.get("images") or ())


def image_crf(params: dict, generation: str | None) -> int:
    """The encode's CRF: the planner's, else this pack generation's default (the same rule)."""
    return int(params["crf"]) if params.get("crf") is not None else default_crf(generation)


def stage_slots(params: dict) -> tuple[int, ...]:
    """A stage's generated keyframe slots: DFR's (`dfr_slots`) or `--num-generated-keyframes`'
    (`generated_slots`: stage 1 outside DFR, or a guided stage's prep); the stage-1 sampler follows DFR's only."""
    return tuple(int(p) for p in params.get("dfr_slots") or params.get("generated_slots") or ())
