"""DFR temporal rounds in the stage graph (LTX-2.5, `temporal_upscalings` 1 or 2). Pure.

Per round r: one worker task upsamples the whole latent x2 in time; every tile of the round is its own
worker task reading that latent and the keyframes carried into the round (never another tile's output),
so a round's tiles run on several Macs at once; a coordinator task stitches the round's latent and the
keyframes it carries on. The keyframes carried into round 1 are the stage-2 latent frames ending on
the canvas slots (a coordinator task picks them). Audio stays stage 1's, frozen, in every tile.
"""

from __future__ import annotations

from coordinator.graph import COORDINATOR, SPATIAL_FACTOR, SpecError, expect, ref, task
from ltx_engine.dfr_layout import MAX_ROUNDS, DfrPlan, plan_dfr, plan_params, resolve_canvas

MAX_TILE_SECONDS = 20.0  # the DiT's temporal positional range (positional_embedding_max_pos[0])
NEEDED_FEATURES = (
    ("temporal_upscaler", "has no temporal upsampler (temporal_upscaler_x2_v1_0.safetensors)"),
    ("keyframes", "is not an LTX-2.5 pack (its DiT has no keyframe position embedding)"),
)


def dfr_rounds(spec: dict) -> int:
    """The spec's temporal rounds as an int; a SpecError when it is not 0..MAX_ROUNDS."""
    value = spec.get("temporal_upscalings") or 0
    try:
        rounds, exact = int(value), float(value)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"temporal upscalings {value!r} is not a number (0, 1 or 2)") from exc
    if not 0 <= rounds <= MAX_ROUNDS or rounds != exact:
        raise SpecError(f"temporal upscalings {value!r} must be 0, 1 or 2")
    return rounds


def spec_plan(spec: dict) -> DfrPlan:
    """The render's DFR plan (canvas, rounds, tiles); the same call the workers and the reducer make."""
    return plan_dfr(spec["frames"], spec["frame_rate"], dfr_rounds(spec), spec["seed"])


def _whole_segment_frames(frames: int) -> tuple[int | None, int]:
    """The nearest frame counts below and above `frames` whose canvas needs no padding."""
    below = next((n for n in range(frames - 8, 8, -8) if resolve_canvas(n).frames == n), None)
    above = next(n for n in range(frames + 8, frames + 8 * 64, 8) if resolve_canvas(n).frames == n)
    return below, above


def _check_canvas(spec: dict, plan: DfrPlan) -> None:
    frames = spec["frames"]
    if plan.canvas.frames != frames:
        below, above = _whole_segment_frames(frames)
        hint = f"{below} or {above}" if below else str(above)
        raise SpecError(f"DFR canvas cannot hold {frames} frames as whole {plan.canvas.segment}-frame keyframe "
                        f"segments (it would pad to {plan.canvas.frames}, which stages 1-2 here do not "
                        f"generate): use {hint} frames")
    for rnd in plan.rounds:
        longest = max(t.local_frames for t in rnd.tiles) / rnd.conditioning_fps
        if longest > MAX_TILE_SECONDS:
            raise SpecError(f"DFR round {rnd.round} tiles span {longest:.1f} s at {rnd.conditioning_fps:g} fps, "
                            f"beyond the model's {MAX_TILE_SECONDS:.0f} s positional range")


def _check_pack(spec: dict, fleet: list[dict]) -> None:
    """Refuse a pack the registered workers say cannot run rounds (workers that say nothing pass)."""
    pack = spec["pack"]
    described = [set(w["pack_features"][pack]) for w in fleet
                 if pack in (w.get("packs") or []) and pack in (w.get("pack_features") or {})]
    if not described:
        return
    for feature, why in NEEDED_FEATURES:
        if not any(feature in features for features in described):
            raise SpecError(f"pack {pack!r} {why}: DFR temporal rounds need it")


def check_dfr(spec: dict, fleet: list[dict]) -> None:
    """Refuse DFR specs that cannot render (one line); record the shipped clip's frame count and rate in
    the spec (`output_frames`, `output_fps`: the decode and the assembler read them)."""
    spec["temporal_upscalings"] = dfr_rounds(spec)
    if spec["temporal_upscalings"] == 0:
        return
    if spec.get("image"):
        raise SpecError("DFR temporal rounds with an image condition are not supported yet")
    try:
        plan = spec_plan(spec)
    except ValueError as exc:
        raise SpecError(f"DFR canvas: {exc}") from exc
    _check_canvas(spec, plan)
    _check_pack(spec, fleet)
    spec["output_frames"], spec["output_fps"] = plan.output_frames, plan.output_fps


def output_frames(spec: dict) -> int:
    """Frames the render ships: (frames - 1) * 2**R + 1."""
    return (spec["frames"] - 1) * 2 ** dfr_rounds(spec) + 1


def _tile_tasks(rid: str, spec: dict, rnd, shared: dict, inputs: dict) -> list[dict]:
    h, w = spec["height"] // SPATIAL_FACTOR, spec["width"] // SPATIAL_FACTOR
    out = []
    for tile in rnd.tiles:
        want = {"latent": expect("float32", 1, -1, tile.latent_frames, h, w),
                "slots": expect("float32", 1, -1, len(tile.slots), h, w)}
        params = {**shared, "round": rnd.round, "tile_index": tile.index, "expect": want}
        out.append(task(rid, f"dfr.r{rnd.round}.t{tile.index}", "dfr_tile", params, inputs))
    return out


def plan_dfr_rounds(rid: str, spec: dict, latent: dict, audio: dict, ctx: dict) -> tuple[list[dict], dict]:
    """The rounds' tasks after stage 2, and the reference to the final (trimmed) video latent."""
    plan = spec_plan(spec)
    dfr = plan_params(spec["frames"], spec["frame_rate"], len(plan.rounds), spec["seed"])
    h, w = spec["height"] // SPATIAL_FACTOR, spec["width"] // SPATIAL_FACTOR
    shared = {"pack": spec["pack"], "dfr": dfr, "source_seconds": spec["frames"] / spec["frame_rate"]}
    tasks = [task(rid, "dfr.carry", "dfr_carry", {"dfr": dfr, "expect": {}}, {"latent": latent},
                  capability=COORDINATOR)]
    carry = ref(f"{rid}.dfr.carry", "keyframes")
    for rnd in plan.rounds:
        up = f"dfr.r{rnd.round}.up"
        tasks.append(task(rid, up, "upsample_temporal", {
            "pack": spec["pack"], "expect": {"latent": expect("float32", 1, -1, rnd.latent_frames, h, w)}},
            {"latent": latent}))
        tile_in = {"latent": ref(f"{rid}.{up}", "latent"), "carry": carry, "audio_latent": audio, **ctx}
        tiles = _tile_tasks(rid, spec, rnd, shared, tile_in)
        stitch_in = {"carry": carry}
        for t in tiles:
            index = t["params"]["tile_index"]
            stitch_in |= {f"t{index}_latent": ref(t["id"], "latent"), f"t{index}_slots": ref(t["id"], "slots")}
        stitch = {"dfr": dfr, "round": rnd.round, "expect": {}}
        tasks += [*tiles, task(rid, f"dfr.r{rnd.round}", "dfr_stitch", stitch, stitch_in, capability=COORDINATOR)]
        latent = ref(f"{rid}.dfr.r{rnd.round}", "latent")
        carry = ref(f"{rid}.dfr.r{rnd.round}", "keyframes")
    return tasks, ref(f"{rid}.dfr.r{len(plan.rounds)}", "video_latent")
