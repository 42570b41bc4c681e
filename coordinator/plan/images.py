"""Images and keyframes in the stage graph. Pure.

Each image of the spec is encoded once per stage resolution as its own `image_encode` task (image k:
`image{k}_s1` at half size for stage 1, `image{k}_s2` at full size for stage 2, the stage-2 tiles and
the DFR rounds), so several keyframes encode on several workers at once. The stage tasks carry every
image as `{frame, strength, binding}` in `params["images"]` (frame resolved against the clip, binding
resolved from `auto` as upstream: frame 0 replaces, any other index guides) beside an input
`image{k}_latent` each; a DFR tile carries only the images that fall in its window. The CRF of the
H.264 round trip is the spec's, else the pack generation's default when the planner knows it (else the
worker's pack decides, the same rule: `ltx_engine.rules.keyframes.default_crf`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from coordinator.plan.diffusion_decode import is_diffusion
from coordinator.plan.graph import SPATIAL_FACTOR, SpecError, expect, ref, task
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules import keyframes
from ltx_engine.rules.dfr_layout import tile_image_frame
from ltx_engine.rules.generation import LTX_25


def _name(k: int, n: int) -> str:
    return "" if n == 1 else f" (image {k} of {n})"


def resolved_images(spec: RenderPlan) -> list[dict]:
    """Each image's {frame, strength, binding} as the stages apply it; SpecError in one line for an
    image not uploaded, a frame outside the clip, a replace off a latent frame's first pixel frame,
    or two replaces on one latent frame."""
    images, frames, out, replaced = spec.images, spec.frames, [], {}
    for k, image in enumerate(images, 1):
        where = _name(k, len(images))
        if not image.blob:
            raise SpecError(f"image condition has no uploaded image{where}")
        written = 0 if image.frame is None else image.frame  # None: the first frame
        try:
            frame = keyframes.resolve_frame(written, frames)
            binding = keyframes.binding_for(image.binding or keyframes.AUTO, written)
            latent = keyframes.replacement_latent_index(frame) if binding == keyframes.REPLACE else None
        except keyframes.ConditioningError as exc:
            why = str(exc).removeprefix("image: ")
            if "outside" in why:
                why = f"image frame {written} is outside 0..{frames - 1}"
            raise SpecError(f"{why}{where}") from None
        if latent is not None and latent in replaced:
            raise SpecError(f"images {replaced[latent]} and {k} both replace latent frame {latent} "
                            f"(frame {frame}): give one of them --image-binding guide")
        if latent is not None:
            replaced[latent] = k
        strength = 1.0 if image.strength is None else image.strength
        out.append({"frame": frame, "strength": strength, "binding": binding, "input": f"image{k}_latent"})
    return out


def image_crf(spec: RenderPlan, image) -> dict:
    """The encode task's CRF param: the spec's, else the recorded generation's default, else none (the
    worker applies its pack's default)."""
    crf = image.crf
    if crf is None and spec.generation:
        crf = keyframes.default_crf(spec.generation)
    return {} if crf is None else {"crf": int(crf)}


def plan_image_encodes(rid: str, spec: RenderPlan, two_stage: bool = True) -> tuple[list[dict], dict, dict, dict]:
    """The encode tasks (one per image per stage size: `two_stage` False, a one-stage recipe's full size
    alone), the stage-1 and stage-2 inputs (`image{k}_latent`), and the stages' `images` params (empty
    without images)."""
    images = spec.images
    if not images:
        return [], {}, {}, {}
    sizes = {"s1": (spec.height // 2, spec.width // 2), "s2": (spec.height, spec.width)}
    if not two_stage:
        del sizes["s1"]
    tasks, inputs = [], {"s1": {}, "s2": {}}
    for k, image in enumerate(images, 1):
        for stage, (h, w) in sizes.items():
            name = f"image{k}_{stage}"
            tasks.append(task(rid, name, "image_encode", {
                "pack": spec.pack, "height": h, "width": w, **image_crf(spec, image),
                "expect": {"latent": expect("float32", 1, -1, 1, h // SPATIAL_FACTOR, w // SPATIAL_FACTOR)}},
                {"image": {"blob": image.blob}}))
            inputs[stage][f"image{k}_latent"] = ref(f"{rid}.{name}", "latent")
    return tasks, inputs["s1"], inputs["s2"], {"images": resolved_images(spec)}


def guide_tokens(params: Mapping, tokens_per_frame: int) -> int:
    """Tokens the stage's guides append after the generated ones (one latent frame per image), which a
    tiled stage's slot range starts after (as `ltx_engine.conditioning.appended_tokens` counts them)."""
    guides = [im for im in params.get("images") or () if im.get("binding") == keyframes.GUIDE]
    return len(guides) * tokens_per_frame


def slot_range(params: Mapping, grid: tuple[int, int, int]) -> list[int] | None:
    """The token range [start, end) of a stage's generated keyframe slots (DFR's or the generated ones):
    after its generated tokens and the appended image guides, before an IC-LoRA reference; None without."""
    slots = params.get("dfr_slots") or params.get("generated_slots") or []
    if not slots:
        return None
    hw = grid[1] * grid[2]
    start = grid[0] * hw + guide_tokens(params, hw)
    return [start, start + len(slots) * hw]


def dfr_tile_images(params_images: Sequence[dict], inputs: Mapping, tile, round_index: int) -> tuple[dict, dict]:
    """A DFR tile's `images` param and image inputs: only the images whose frame falls in its window,
    the frame on the round's own clip (each round doubles the frame rate: frame p is 2**r · p there)."""
    scaled = [{**im, "frame": int(im["frame"]) * 2**round_index} for im in params_images]
    keep = [im for im in scaled if tile_image_frame(tile, im["frame"]) is not None]
    return ({"images": keep} if params_images else {}), {im["input"]: inputs[im["input"]] for im in keep}


def generated_slots(spec: RenderPlan) -> list[int]:
    """`--num-generated-keyframes N` outside DFR (LTX-2.5): N generated keyframe slots in stage 1 at the
    evenly spaced interior pixel frames linspace(0, F - 1, N + 2) rounded, ends excluded (the MLX port's
    rule for upstream's `VideoGeneratedKeyframeSlots`); stage 2 carries them only for a decode that reads
    them (`carried_slots`); DFR places its own (the modifier table refuses the two together). SpecError: on a pack not
    known to be 2.5, or more slots than the clip has distinct interior frames."""
    n = spec.num_generated_keyframes
    if not n:
        return []
    if spec.generation != LTX_25:
        raise SpecError(f"--num-generated-keyframes needs an LTX-2.5 pack (its DiT's keyframe embedding); "
                        f"pack {spec.pack!r} is {spec.generation or 'not described by any worker yet'}")
    frames = spec.frames
    slots = [round(i * (frames - 1) / (n + 1)) for i in range(1, n + 1)]
    if len(set(slots)) != n or not all(0 < p < frames - 1 for p in slots):
        raise SpecError(f"{n} generated keyframes do not fit between the first and last of {frames} frames")
    return slots


def carried_slots(spec: RenderPlan) -> list[int]:
    """The generated keyframes stage 2 carries: all of them when the decode reads them (the diffusion
    decoder's keyframes need full-size planes), by upstream's one rule for carrying slots (DFR's stage 2:
    stage 1's slots through the spatial upsampler as the slots' initial latent, re-noised and denoised
    beside the video); else none, as upstream's two-stage pipelines (their stage 2 has no slots)."""
    return generated_slots(spec) if is_diffusion(spec) else []


def generated_slot_params(spec: RenderPlan, height: int, width: int, slots: list[int] | None = None
                          ) -> tuple[dict, dict]:
    """A stage's params and expected `slots` output for the generated keyframes (none without them):
    stage 1's, or `slots` (stage 2's carried ones)."""
    slots = generated_slots(spec) if slots is None else slots
    if not slots:
        return {}, {}
    shape = (1, -1, len(slots), height // SPATIAL_FACTOR, width // SPATIAL_FACTOR)
    return {"generated_slots": slots}, {"slots": expect("float32", *shape)}
