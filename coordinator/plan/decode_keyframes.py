"""The keyframes a keyframe-aware decode (the diffusion decoder's) attends to, on every recipe. Pure.

Why one rule for all recipes: upstream after 1.2.0 and the MLX port decode every render that has
keyframes with them, not DFR's alone. A render's keyframes are DFR's carried planes when it runs DFR
(whichever recipe: IC-LoRA and Dub-It take `--dfr`; its canvas and slots supersede the clip's frames,
`plan/dfr_finish.final_keyframes`), else the HDR grade's seam slots (its one full-size stage's generated
keyframes, `decode(latent, slots, seams)` of `ltx_engine.hdr_pipeline`, as the MLX port decodes them),
else the `--num-generated-keyframes` slots stage 2 carried for this decode (`images.carried_slots`; like
DFR's, they supersede the images as planes), else its `--image`s past frame 0, each the full-size latent its `image{k}_s2` encode task already makes
for stage 2 (`plan/images.py`; frame 0 is the clip's first latent frame, not a plane beside it). What composes with what is the modifier table's
(`plan/recipes/modifiers.py`: `--image` and `--video-decoder diffusion`), so nothing here names a
recipe. The conv decoder ignores keyframes (as the MLX port's does), so only diffusion decode tasks get
them (`plan/render.py`).

A decode task gets params `keyframe_frames` (every referenced plane's global pixel frame) and
`keyframe_planes` (the indices it attends to: inside the clip, and for a tile the ones
`dfr_epilogue.planes_for_tile` picks); its inputs are DFR's stacked planes (`keyframes`) or one input
per attended image plane (`keyframe{i}`), which the worker reads with `dfr_epilogue.task_keyframes`.
"""

from __future__ import annotations

from coordinator.plan.dfr import dfr_on, spec_plan
from coordinator.plan.dfr_finish import final_keyframes
from coordinator.plan.graph import ref
from coordinator.plan.hdr import STAGE, is_hdr, seams
from coordinator.plan.images import carried_slots, resolved_images
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.dfr_epilogue import planes_for_tile


def image_keyframes(rid: str, spec: RenderPlan) -> tuple[list[dict], tuple[int, ...]] | None:
    """The `--image` planes past frame 0 (refs to their full-size encodes) and their pixel frames, in
    frame order (the spec's order on a tie); None when there are none."""
    found = sorted(
        (int(image["frame"]), k)
        for k, image in enumerate(resolved_images(spec), 1)
        if int(image["frame"]) > 0
    )
    if not found:
        return None
    return [ref(f"{rid}.image{k}_s2", "latent") for _, k in found], tuple(frame for frame, _ in found)


def hdr_keyframes(rid: str, spec: RenderPlan) -> tuple[dict, tuple[int, ...]] | None:
    """The HDR grade's seam slots (one stacked ref to its stage's `slots`) and their pixel frames; None
    without seams (`--no-keyframes`, or a clip too short to have one)."""
    at = seams(spec)
    return (ref(f"{rid}.{STAGE}", "slots"), at) if at else None


def render_keyframes(rid: str, spec: RenderPlan, last: str = "stage2"
                     ) -> tuple[dict | list[dict], tuple[int, ...]] | None:
    """The render's decode keyframes: DFR's planes (one stacked ref) when it runs DFR, the HDR grade's
    seam slots, the generated keyframes stage 2 carried (one stacked ref each), else its images' (one
    ref per plane); None when it has none. `last`: the stage whose slots are full size (a one-stage
    recipe's stage 1)."""
    if dfr_on(spec):
        return final_keyframes(rid, spec)
    if is_hdr(spec):
        return hdr_keyframes(rid, spec)
    carried = carried_slots(spec)
    return (ref(f"{rid}.{last}", "slots"), tuple(carried)) if carried else image_keyframes(rid, spec)


def shipped_frames(spec: RenderPlan) -> int:
    """Frames the decode makes: DFR's trimmed output, else the clip's."""
    return spec_plan(spec).output_frames if dfr_on(spec) else spec.frames


def keyframe_decode_io(rid: str, spec: RenderPlan, frames: tuple[int, int] | None = None,
                       last: str = "stage2") -> tuple[dict, dict]:
    """What a keyframe-aware decode task adds (whole, or one tile over pixel frames [lo, hi]): its
    keyframe params and inputs; empty when the render has no keyframes."""
    found = render_keyframes(rid, spec, last)
    if found is None:
        return {}, {}
    source, positions = found
    inside = [i for i, p in enumerate(positions) if p < shipped_frames(spec)]
    if frames is not None:
        inside = [inside[j] for j in planes_for_tile([positions[i] for i in inside], *frames)]
    params = {"keyframe_frames": list(positions), "keyframe_planes": inside}
    if isinstance(source, dict):  # DFR's planes, stacked by its stitch or trim; slots, by their stage
        return params, {"keyframes": source}
    return params, {f"keyframe{i}": source[i] for i in inside}
