"""The pure rules of image conditions (keyframes), shared by the engine, the planner and the CLI.

No arrays here: which pixel frame a written index means, which binding `auto` picks, which latent frame
a `replace` covers, and the H.264 CRF each LTX generation's preprocessing uses by default (upstream
`DEFAULT_IMAGE_CRF` = 33, and 18 from LTX-2.4 on: `ltx_pipelines.utils.constants`). The planner checks a
spec with the very functions the engine conditions with, so a frame it accepts is one the stage takes.
"""

from __future__ import annotations

from ltx_engine.rules.generation import LTX_25

REPLACE, GUIDE, AUTO = "replace", "guide", "auto"
BINDINGS = (REPLACE, GUIDE, AUTO)
LAST = "last"
DEFAULT_CRF = 33       # upstream 1.0.0 DEFAULT_IMAGE_CRF (LTX-2 / 2.3)
DEFAULT_CRF_25 = 18    # upstream LTX_2_4_IMAGE_CRF: 2.4 and later (the farm's LTX-2.5 packs)


class ConditioningError(ValueError):
    """An image condition that cannot apply: one line naming the image."""


def default_crf(generation: str | None) -> int:
    """The CRF of the H.264 round trip an image takes before encoding when the spec names none."""
    return DEFAULT_CRF_25 if generation == LTX_25 else DEFAULT_CRF


def resolve_frame(frame: int | str, frames: int, name: str = "image") -> int:
    """The pixel frame index in [0, frames) a written index means (negative from the end, `last`)."""
    if frame == LAST:
        return frames - 1
    if isinstance(frame, str) or isinstance(frame, bool):
        raise ConditioningError(f"{name}: frame {frame!r} is not an integer or 'last'")
    index = frame + frames if frame < 0 else frame
    if not 0 <= index < frames:
        raise ConditioningError(f"{name}: frame {frame} is outside the clip's {frames} frames")
    return index


def binding_for(binding: str, frame: int | str, name: str = "image") -> str:
    """`replace` or `guide`; `auto` decides from the index as written: frame 0 replaces."""
    if binding not in BINDINGS:
        raise ConditioningError(f"{name}: binding {binding!r} is not one of {', '.join(BINDINGS)}")
    if binding != AUTO:
        return binding
    return REPLACE if frame == 0 else GUIDE


def replacement_latent_index(pixel_frame: int, name: str = "image") -> int:
    """The latent frame a pixel frame starts under the causal VAE: 0 -> 0, 1 + 8k -> k + 1."""
    if pixel_frame == 0:
        return 0
    if (pixel_frame - 1) % 8:
        raise ConditioningError(f"{name}: replace needs frame 0 or 1 + 8k (a latent frame's first), got {pixel_frame}")
    return (pixel_frame - 1) // 8 + 1
