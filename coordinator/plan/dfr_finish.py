"""DFR after stage 2: the rounds, or the base path at 0 rounds, or the spatial epilogue; the trimmed
latent and the keyframes its decode receives. Pure.

Base path (`--dfr`, 0 rounds): stages 1-2 generate the padded canvas with keyframe slots (plan/dfr.py);
a coordinator task trims the canvas latent to the asked length and keeps the slots inside it as the
decode's keyframes (upstream `decode_keyframes_from_slots`).

Spatial epilogue (`--spatial-upscalings 2`, upstream `run_spatial_epilogue`, ltx_engine/rules/dfr_epilogue.py):
the stages run at half size; each carried keyframe plane is rebuilt at full size by its own worker task
(decode, Lanczos x2, encode: the planes on several Macs at once); the canvas latent is spatially
upsampled; then one detailing pass over the stage-2 sigmas whose spatial tiles are worker tasks at every
step (2x2 at the first step, 4x4 after), blended and stepped by the coordinator as tiled stage 2 is. At 0
rounds the canvas is one temporal window; after temporal rounds one window per last-round tile
(`ltx_engine/rules/dfr_windows.py`, upstream `TilePrefix`), chained: a coordinator task `dfr_epi_window` cuts
window w's latent, reference and audio, and pins its prefix on window w-1's finished output, so the
windows run one after another while each window's spatial tiles run on several Macs at once.
"""

from __future__ import annotations

from coordinator.plan import samplers
from coordinator.plan.dfr import (
    detailing_params,
    dfr_on,
    dfr_rounds,
    plan_dfr_rounds,
    spatial_upscalings,
    spec_plan,
)
from coordinator.plan.graph import (
    COORDINATOR,
    SPATIAL_FACTOR,
    audio_latent_frames,
    expect,
    latent_frames,
    ref,
    task,
)
from coordinator.plan.loras import lora_params
from coordinator.plan.resolved import RenderPlan
from coordinator.plan.stage2 import _forward_task
from ltx_engine.rules import dfr_epilogue, dfr_windows, tdp
from ltx_engine.rules.dfr_layout import plan_params
from ltx_engine.rules.generation import LTX_25
from ltx_engine.rules.sampling import STAGE_2_DISTILLED_SIGMAS

EPI = "dfr.epi"


def stage_view(spec: RenderPlan) -> RenderPlan:
    """The plan stages 1-2 (and the rounds) read: half the asked size before the epilogue."""
    if spatial_upscalings(spec) == 1:
        return spec
    return spec.with_asked(height=spec.height // 2, width=spec.width // 2)


def _dfr(spec: RenderPlan) -> dict:
    return plan_params(spec.frames, spec.frame_rate, dfr_rounds(spec), spec.seed)


def carried_positions(spec: RenderPlan) -> tuple[int, ...]:
    """The planes the epilogue rebuilds: the last round's carry, or stage 2's slots at 0 rounds."""
    plan = spec_plan(spec)
    return plan.rounds[-1].carry() if plan.rounds else plan.canvas.slots


def _trim(rid: str, spec: RenderPlan, latent: dict, keyframes: dict) -> dict:
    """The coordinator's trim: the canvas latent (or the epilogue windows' joined) cut to the asked
    frames, the keyframes inside them."""
    params = {"dfr": _dfr(spec), "positions": list(carried_positions(spec)), "expect": {}}
    if "w0" in latent:
        params["windows"] = len(latent)
    return task(
        rid,
        "dfr.trim",
        "dfr_trim",
        params,
        {**(latent if "w0" in latent else {"latent": latent}), **keyframes},
        capability=COORDINATOR,
    )


def plan_dfr_finish(
    rid: str, spec: RenderPlan, ctx: dict, cond2: dict, image_params: dict, audio: dict
) -> tuple[list[dict], dict]:
    """The tasks after stage 2 and the reference to the latent the decode reads; `audio`: the stages' audio
    latent the epilogue carries (stage 1's, or A2V's frozen track)."""
    latent, slots = ref(f"{rid}.stage2", "video_latent"), ref(f"{rid}.stage2", "slots")
    rounds = dfr_rounds(spec)
    if rounds:
        tasks, final = plan_dfr_rounds(rid, stage_view(spec), latent, slots, ctx, cond2, image_params)
        if spatial_upscalings(spec) == 1:
            return tasks, final
        latent, slots = ref(f"{rid}.dfr.r{rounds}", "latent"), ref(f"{rid}.dfr.r{rounds}", "keyframes")
    else:
        tasks = []
    if spatial_upscalings(spec) == 1:
        return [_trim(rid, spec, latent, {"keyframes": slots})], ref(f"{rid}.dfr.trim", "video_latent")
    epilogue, joined = _plan_epilogue(rid, spec, latent, slots, ctx, audio)
    planes = {f"kf{i}": ref(f"{rid}.{EPI}.kf{i}", "latent") for i in range(len(carried_positions(spec)))}
    return [*tasks, *epilogue, _trim(rid, spec, joined, planes)], ref(f"{rid}.dfr.trim", "video_latent")


def final_keyframes(rid: str, spec: RenderPlan) -> tuple[dict, tuple[int, ...]] | None:
    """The decode's keyframes for a keyframe-aware decoder (the diffusion decoder): the reference to the
    planes and their global pixel frames (the planes already cut to the clip; after rounds the last
    stitch's whole carry, to cut with `dfr_epilogue.decode_keyframes`); None without DFR. The conv
    decoder ignores them, as upstream's does."""
    if not dfr_on(spec):
        return None
    plan = spec_plan(spec)
    if plan.rounds and spatial_upscalings(spec) == 1:
        return ref(f"{rid}.dfr.r{len(plan.rounds)}", "keyframes"), plan.rounds[-1].carry()
    kept = tuple(p for p in carried_positions(spec) if p < plan.output_frames)
    return (ref(f"{rid}.dfr.trim", "keyframes"), kept) if kept else None


def _keyframe_tasks(rid: str, spec: RenderPlan, slots: dict, latent: dict) -> list[dict]:
    """One worker task per carried plane (`kf{i}`), and one for the opening frame (`open`: the previous
    latent's first frame; upstream anchors frame 0 on it when no image sits there, and does not ship
    it): each decoded alone, Lanczos x2, encoded at the full size."""
    h, w = spec.height, spec.width
    want = {"latent": expect("float32", 1, -1, 1, h // SPATIAL_FACTOR, w // SPATIAL_FACTOR)}
    planes = [(f"kf{i}", i, slots) for i in range(len(carried_positions(spec)))] + [("open", 0, latent)]
    return [
        task(
            rid,
            f"{EPI}.{name}",
            "dfr_keyframe_plane",
            {"pack": spec.pack, "plane": plane, "height": h, "width": w, "expect": want},
            {"keyframes": source},
        )
        for name, plane, source in planes
    ]


def _window_images(spec: RenderPlan, window: dfr_windows.Window | None) -> list[dict]:
    """The window's guides: the rebuilt planes it holds (window-local frames), the opening plane
    (first window), and for a non-first window its pinned prefix (a strength-1 replace at frame 0)."""
    positions = carried_positions(spec)
    if window is None:
        held = [(i, p) for i, p in enumerate(positions)]
    else:
        held = dfr_windows.window_planes(window, positions, spec_plan(spec).final_frames - 1)
    strength = dfr_epilogue.KEYFRAME_STRENGTH
    images = [
        {"frame": f, "strength": strength, "binding": "guide", "input": f"kf{i}_latent"} for i, f in held
    ]
    if window is None or window.plane is None:
        images.append({"frame": 0, "strength": strength, "binding": "guide", "input": "open_latent"})
    else:
        images.append({"frame": 0, "strength": 1.0, "binding": "replace", "input": "prefix_latent"})
    return images


def _prepare_params(spec: RenderPlan, window: dfr_windows.Window | None = None) -> dict:
    """The epilogue state's params (the canvas, or one window of it after rounds, at full size): the
    rebuilt planes as strength-1 guides, stage 1's audio frozen, noise seed + 2000 (+ 100 per window),
    ancestral re-noise (LTX-2.5) from seed + 30000 (+ 100 per window)."""
    plan = spec_plan(spec)
    frames, fps = plan.canvas.frames, spec.frame_rate
    seed = spec.seed + dfr_epilogue.NOISE_SEED_OFFSET
    if window is not None:
        frames, fps = window.local_frames, plan.rounds[-1].conditioning_fps
        seed += dfr_epilogue.WINDOW_SEED_STRIDE * window.index
    sampler = samplers.stage2_params(spec)
    if sampler:  # the farm keys re-noise by the stage's seed + offset: seed + 2000 + 28000 = seed + 30000
        sampler["ancestral_offset"] = (
            dfr_epilogue.ANCESTRAL_NOISE_SEED_OFFSET - dfr_epilogue.NOISE_SEED_OFFSET
        )
    return {
        "pack": spec.pack,
        "seed": seed,
        "frames": frames,
        "fps": fps,
        "height": spec.height,
        "width": spec.width,
        "sigmas": list(STAGE_2_DISTILLED_SIGMAS),
        "audio_frames": audio_latent_frames(frames, fps),
        "noise_stream": 1,
        "images": _window_images(spec, window),
        **detailing_params(spec),
        **sampler,
    }


def _window_task(rid: str, spec: RenderPlan, window: dfr_windows.Window, previous: str | None,
                 audio: dict) -> dict:
    """The coordinator's cut of one window (after rounds): its latent, reference, audio and prefix."""
    inputs = {
        "up": ref(f"{rid}.{EPI}.up", "latent"),
        "guide": ref(f"{rid}.dfr.r{dfr_rounds(spec)}", "latent"),
        "audio": audio,
    }
    if window.plane is not None:
        plane = carried_positions(spec).index(window.plane)
        inputs |= {
            "plane": ref(f"{rid}.{EPI}.kf{plane}", "latent"),
            "previous": ref(previous, "video_latent"),
        }
    params = {"dfr": _dfr(spec), "window": window.index, "expect": {}}
    return task(rid, f"{EPI}.w{window.index}.in", "dfr_epi_window", params, inputs, capability=COORDINATOR)


def _plan_epilogue(rid: str, spec: RenderPlan, latent: dict, slots: dict, ctx: dict,
                   audio: dict) -> tuple[list[dict], dict]:
    """Keyframe planes, the spatial upsample, the tiled detailing steps of each window (chained after
    rounds); the reference to the epilogue's latent (or the windows' outputs, to join at the trim)."""
    h, w = spec.height // SPATIAL_FACTOR, spec.width // SPATIAL_FACTOR
    tasks = _keyframe_tasks(rid, spec, slots, latent)
    planes = {f"{t['id'].rsplit('.', 1)[1]}_latent": ref(t["id"], "latent") for t in tasks}
    up_frames = latent_frames(spec_plan(spec).final_frames)
    tasks.append(
        task(
            rid,
            f"{EPI}.up",
            "upsample_spatial",
            {"pack": spec.pack, "expect": {"latent": expect("float32", 1, -1, up_frames, h, w)}},
            {"latent": latent},
        )
    )
    if not dfr_rounds(spec):
        params = _prepare_params(spec)
        inputs = {
            "latent": ref(f"{rid}.{EPI}.up", "latent"),
            "audio_latent": audio,
            **planes,
        }
        if spec.detailing_lora:  # the IC-LoRA's reference: the previous stage's video
            inputs["reference_latent"] = latent
        tasks.append(task(rid, f"{EPI}.prep", "stage_prepare", {**params, "expect": {}}, inputs))
        return tasks + _epilogue_steps(rid, spec, params, (up_frames, h, w), ctx, EPI), ref(
            f"{rid}.{EPI}", "video_latent"
        )
    joined, previous = {}, None
    for window in dfr_windows.plan_windows(spec_plan(spec)):
        name = f"{EPI}.w{window.index}"
        cut = _window_task(rid, spec, window, previous, audio)
        params = _prepare_params(spec, window)
        held = {im["input"] for im in params["images"]}
        inputs = {
            "latent": ref(cut["id"], "latent"),
            "audio_latent": ref(cut["id"], "audio"),
            **{k: v for k, v in planes.items() if k in held},
        }
        if window.plane is not None:
            inputs["prefix_latent"] = ref(cut["id"], "prefix")
        if spec.detailing_lora:
            inputs["reference_latent"] = ref(cut["id"], "reference")
        tasks += [cut, task(rid, f"{name}.prep", "stage_prepare", {**params, "expect": {}}, inputs)]
        tasks += _epilogue_steps(rid, spec, params, (window.cells, h, w), ctx, name)
        previous = f"{rid}.{name}"
        joined[f"w{window.index}"] = ref(previous, "video_latent")
    return tasks, joined


def _epilogue_steps(
    rid: str, spec: RenderPlan, params: dict, grid: tuple[int, int, int], ctx: dict, name: str
) -> list[dict]:
    prep = f"{rid}.{name}.prep"
    tilings = dfr_epilogue.step_tilings(grid, len(params["sigmas"]) - 1)
    marker = {"marker": True} if spec.generation == LTX_25 else {}
    shared = {"grid": list(grid), "sigmas": params["sigmas"], **marker, **samplers.step_params(params)}

    def geometry(step: int) -> dict:
        return {**shared, "counts": list(tilings[step][0]), "overlap": list(tilings[step][1])}

    state = {k: ref(prep, k) for k in ("clean", "mask", "positions")}
    audio = {k: ref(prep, k) for k in ("audio_latent", "audio_mask", "audio_positions")}
    tasks = [
        task(
            rid,
            f"{name}.cut",
            "tdp_cut",
            {**geometry(0), "expect": {}},
            {**state, "latent": ref(prep, "latent")},
            capability=COORDINATOR,
        )
    ]
    source, latent_src = tasks[0]["id"], prep
    for step in range(len(tilings)):
        tiles = tdp.plan(grid, tilings[step][0], tilings[step][1])
        tasks += [
            _forward_task(rid, step, tile, grid, params, source, bool(marker), {**audio, **ctx}, name=name,
                          dit=lora_params(spec))
            for tile in tiles
        ]
        last = step == len(tilings) - 1
        step_name = name if last else f"{name}.s{step}"
        step_in = {f"v{t.index}": ref(f"{rid}.{name}.s{step}.t{t.index}", "velocity") for t in tiles}
        step_params = {**geometry(step), "step": step, "expect": {}}
        if not last:
            step_params["next_tiling"] = {
                "counts": list(tilings[step + 1][0]),
                "overlap": list(tilings[step + 1][1]),
            }
        tasks.append(
            task(
                rid,
                step_name,
                "tdp_step",
                step_params,
                {**state, "latent": ref(latent_src, "latent"), **step_in},
                capability=COORDINATOR,
            )
        )
        source = latent_src = f"{rid}.{step_name}"
    return tasks
