"""DFR in the stage graph (LTX-2.5, `--dfr`, `temporal_upscalings` 0-2), as upstream's DFRPipeline. Pure.

Stages 1-2 generate the padded canvas (frames - 1 up to whole 24/32-frame segments) with generated
keyframe slots at every segment boundary; stage 1's slots are spatially upsampled into stage 2's.
Per round r: one worker task upsamples the whole latent x2 in time; every tile of the round is its own
worker task reading that latent and the keyframes carried into the round; a non-first tile also reads
the tile before it (its window latent and new slots) for its pinned prefix (upstream's `TilePrefix`,
`dfr_layout.tile_prefix`), so a round's tiles run one after another; a coordinator task stitches the
round's latent and the keyframes it carries on. Round 1's anchors are stage 2's slots. The tiles run video only (upstream
passes no audio to the rounds); the shipped audio is stage 1's, cut to the trimmed clip.
"""

from __future__ import annotations

from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import COORDINATOR, SPATIAL_FACTOR, SpecError, expect, ref, task
from coordinator.plan.images import dfr_tile_images
from coordinator.plan.loras import lora_params
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.dfr_layout import MAX_ROUNDS, DfrPlan, plan_dfr, plan_params

MAX_TILE_SECONDS = 20.0  # the DiT's temporal positional range (positional_embedding_max_pos[0])
NEEDED_FEATURES = (
    ("temporal_upscaler", "has no temporal upsampler (temporal_upscaler_x2_v1_0.safetensors)"),
    ("keyframes", "is not an LTX-2.5 pack (its DiT has no keyframe position embedding)"),
)


def dfr_rounds(spec: RenderPlan) -> int:
    """The spec's temporal rounds; a SpecError when it is not 0..MAX_ROUNDS (the spec takes up to 4)."""
    rounds = spec.temporal_upscalings
    if not 0 <= rounds <= MAX_ROUNDS:
        raise SpecError(f"temporal upscalings {rounds!r} must be 0, 1 or 2")
    return rounds


def spatial_upscalings(spec: RenderPlan) -> int:
    """1, or 2: DFR's stages at half the asked size, then the spatial epilogue at it (plan/dfr_finish.py)."""
    return spec.spatial_upscalings  # the spec's rule holds it to 1..2


def dfr_on(spec: RenderPlan) -> bool:
    """DFR's pipeline: asked with --dfr (0 rounds: the base path), temporal rounds or the epilogue."""
    return bool(spec.dfr) or dfr_rounds(spec) > 0 or spatial_upscalings(spec) == 2


def spec_plan(spec: RenderPlan) -> DfrPlan:
    """The render's DFR plan (canvas, rounds, tiles); the same call the workers and the reducer make."""
    return plan_dfr(spec.frames, spec.frame_rate, dfr_rounds(spec), spec.seed)


def _check_canvas(spec: RenderPlan, plan: DfrPlan) -> None:
    if plan.canvas.frames / spec.frame_rate > MAX_TILE_SECONDS:
        raise SpecError(f"DFR canvas of {plan.canvas.frames} frames (padded from {spec.frames} to whole "
                        f"{plan.canvas.segment}-frame segments) exceeds the model's {MAX_TILE_SECONDS:.0f} s range")
    for rnd in plan.rounds:
        longest = max(t.local_frames for t in rnd.tiles) / rnd.conditioning_fps
        if longest > MAX_TILE_SECONDS:
            raise SpecError(f"DFR round {rnd.round} tiles span {longest:.1f} s at {rnd.conditioning_fps:g} fps, "
                            f"beyond the model's {MAX_TILE_SECONDS:.0f} s positional range")


def _check_pack(spec: RenderPlan, fleet: Fleet) -> None:
    """Refuse a pack the registered workers say cannot run rounds (workers that say nothing pass)."""
    pack = spec.pack
    features = fleet.features(pack)
    if features is None:
        return
    for feature, why in NEEDED_FEATURES[0 if dfr_rounds(spec) else 1:]:  # no upsampler without rounds
        if feature not in features:
            raise SpecError(f"pack {pack!r} {why}: DFR {'temporal rounds need' if dfr_rounds(spec) else 'needs'} it")


def check_dfr(spec: RenderPlan, fleet: Fleet) -> dict[str, int | float]:
    """Refuse DFR specs that cannot render (one line); the shipped clip's frame count and rate for the
    resolved plan (`output_frames`, `output_fps`: the decode and the assembler read them), none without DFR."""
    if not dfr_on(spec):  # a detailing LoRA without DFR's stage 2: the modifier table refuses it
        return {}
    check_epilogue(spec)
    _check_detailing(spec)
    try:
        plan = spec_plan(spec)
    except ValueError as exc:
        raise SpecError(f"DFR canvas: {exc}") from exc
    _check_canvas(spec, plan)
    _check_pack(spec, fleet)
    return {"output_frames": plan.output_frames, "output_fps": plan.output_fps}


def check_epilogue(spec: RenderPlan) -> None:
    """Refuse an epilogue the farm cannot plan (one line each); nothing without one. (Which recipes take
    DFR is the modifier table's, `plan/recipes/`.)"""
    if spatial_upscalings(spec) != 2:
        return
    for key, value in (("height", spec.height), ("width", spec.width)):
        if value % 128:
            raise SpecError(f"--spatial-upscalings 2 runs stage 1 at a quarter of the size: {key} {value} is not "
                            f"a multiple of 128 (try {max(128, round(value / 128) * 128)})")
    if spec.images:
        raise SpecError("--spatial-upscalings 2 with --image is not built on the farm yet")


def output_frames(spec: RenderPlan) -> int:
    """Frames the render ships: (frames - 1) * 2**R + 1."""
    return (spec.frames - 1) * 2 ** dfr_rounds(spec) + 1


def _check_detailing(spec: RenderPlan) -> None:
    """The detailing IC-LoRA is a file in the pack folder (a plain name) with a strength in [0, 2]."""
    name = spec.detailing_lora
    if name is None:
        return
    if not isinstance(name, str) or not name.endswith(".safetensors") or "/" in name or "\\" in name or name.startswith("."):
        raise SpecError(f"detailing LoRA {str(name)[:80]!r} is not a .safetensors file name in the pack folder")
    strength = spec.detailing_strength
    if not 0.0 <= strength <= 2.0:
        raise SpecError(f"detailing strength {strength} is outside [0, 2]")


def detailing_params(spec: RenderPlan) -> dict:
    """Stage 2's detailing IC-LoRA params (DFR only); none without one."""
    name = spec.detailing_lora
    return {"detailing_lora": name, "detailing_strength": spec.detailing_strength} if name else {}


def canvas_frames(spec: RenderPlan) -> int:
    """Frames stages 1-2 generate: DFR's padded canvas (trimmed after the rounds), else the clip's."""
    return spec_plan(spec).canvas.frames if dfr_on(spec) else spec.frames


def slot_count(spec: RenderPlan) -> int:
    """DFR's keyframe slots on its canvas; 0 without DFR."""
    return len(spec_plan(spec).canvas.slots) if dfr_on(spec) else 0


def slot_params(spec: RenderPlan) -> dict:
    """Stage params for DFR's generated keyframe slots (upstream's canvas positions); none without DFR."""
    return {"dfr_slots": list(spec_plan(spec).canvas.slots)} if dfr_on(spec) else {}


def slot_expect(spec: RenderPlan, height: int, width: int) -> dict:
    """The `slots` output a DFR stage gives: (1, C, K, h, w), one latent frame per slot."""
    if not dfr_on(spec):
        return {}
    k = len(spec_plan(spec).canvas.slots)
    return {"slots": expect("float32", 1, -1, k, height // SPATIAL_FACTOR, width // SPATIAL_FACTOR)}


def plan_slot_upsample(rid: str, spec: RenderPlan, slots: dict, count: int) -> list[dict]:
    """Stage 1's `count` slots through the spatial upsampler for stage 2 (as upstream's DFR upsamples
    them): DFR's, or the generated keyframes stage 2 carries (`images.carried_slots`); none at 0."""
    if not count:
        return []
    shape = (1, -1, count, spec.height // SPATIAL_FACTOR, spec.width // SPATIAL_FACTOR)
    return [task(rid, "upsample.slots", "upsample_spatial", {"pack": spec.pack, "expect": {
        "latent": expect("float32", *shape)}}, {"latent": slots})]


def _tile_tasks(rid: str, spec: RenderPlan, rnd, shared: dict, inputs: dict, images: dict) -> list[dict]:
    h, w = spec.height // SPATIAL_FACTOR, spec.width // SPATIAL_FACTOR
    out = []
    for tile in rnd.tiles:
        want = {"latent": expect("float32", 1, -1, tile.latent_frames, h, w),
                "slots": expect("float32", 1, -1, len(tile.slots), h, w)}
        held, held_inputs = dfr_tile_images(shared.get("images") or [], images, tile, rnd.round)  # in its window
        params = {**shared, **held, "round": rnd.round, "tile_index": tile.index, **lora_params(spec), "expect": want}
        chained = {} if not tile.pinned else {  # its prefix: the tile before it (upstream's TilePrefix)
            "previous": ref(out[-1]["id"], "latent"), "previous_slots": ref(out[-1]["id"], "slots")}
        out.append(task(rid, f"dfr.r{rnd.round}.t{tile.index}", "dfr_tile", params,
                        {**inputs, **held_inputs, **chained}))
    return out


def plan_dfr_rounds(rid: str, spec: RenderPlan, latent: dict, carry: dict, ctx: dict, image: dict,
                    image_params: dict) -> tuple[list[dict], dict]:
    """The rounds' tasks after stage 2, and the reference to the final (trimmed) video latent. Round 1's
    anchors are stage 2's keyframe slots (`carry`); an image conditions the tiles whose window holds it
    (`image`: the full-size image latents, `image_params`: their `images` param, plan/images.py)."""
    plan = spec_plan(spec)
    dfr = plan_params(spec.frames, spec.frame_rate, len(plan.rounds), spec.seed)
    h, w = spec.height // SPATIAL_FACTOR, spec.width // SPATIAL_FACTOR
    shared = {"pack": spec.pack, "dfr": dfr, **image_params}
    tasks = []
    for rnd in plan.rounds:
        up = f"dfr.r{rnd.round}.up"
        tasks.append(task(rid, up, "upsample_temporal", {
            "pack": spec.pack, "expect": {"latent": expect("float32", 1, -1, rnd.latent_frames, h, w)}},
            {"latent": latent}))
        tile_in = {"latent": ref(f"{rid}.{up}", "latent"), "carry": carry, **ctx}
        tiles = _tile_tasks(rid, spec, rnd, shared, tile_in, image)
        stitch_in = {"carry": carry}
        for t in tiles:
            index = t["params"]["tile_index"]
            stitch_in |= {f"t{index}_latent": ref(t["id"], "latent"), f"t{index}_slots": ref(t["id"], "slots")}
        stitch = {"dfr": dfr, "round": rnd.round, "expect": {}}
        tasks += [*tiles, task(rid, f"dfr.r{rnd.round}", "dfr_stitch", stitch, stitch_in, capability=COORDINATOR)]
        latent = ref(f"{rid}.dfr.r{rnd.round}", "latent")
        carry = ref(f"{rid}.dfr.r{rnd.round}", "keyframes")
    return tasks, ref(f"{rid}.dfr.r{len(plan.rounds)}", "video_latent")
