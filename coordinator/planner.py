"""The job compiler: a RenderSpec becomes a stage graph of tasks. Pure: no Redis, no gRPC, no models.

Task dicts are what the store keeps: id, kind, params, inputs ({name: {"blob": sha}} or
{name: {"task": id, "output": name}}), deps, capability. `params["expect"]` names each output's dtype
and shape (-1 = not known here) so the scheduler can refuse a malformed result.
"""

from __future__ import annotations

from typing import Any

from ltx_engine import tdp
from ltx_engine.sampling import DISTILLED_SIGMAS, STAGE_2_DISTILLED_SIGMAS, TDP_STAGE_2_SIGMAS

CAPABILITY = "mlx"
COORDINATOR = "coordinator"  # tasks the coordinator's reducer runs (pure math between tiled forwards)
SPATIAL_FACTOR = 32
TEMPORAL_FACTOR = 8
MAX_SIDE = 2048          # the reference's spatial positional range (pixels)
MAX_SECONDS = 20.0       # the reference's temporal positional range (seconds)
MAX_FRAMES = 1 + 8 * 64

DEFAULTS: dict[str, Any] = {
    "prompt": "",
    "height": 256,
    "width": 384,
    "frames": 25,
    "frame_rate": 24.0,
    "seed": 1,
    "pack": "tiny",
    "image": None,
    "audio": True,
    "stage2_tiles": None,     # None: one stage-2 task; "auto" | "HxW" | "FxHxW": tiled data parallel
    "tile_overlap": 5,
    "stage2_sigmas": None,
}


class SpecError(ValueError):
    """A render that must not be queued; the message is the one line the user sees."""


def normalize_spec(raw: dict) -> dict:
    """The spec with defaults filled in and numbers typed; unknown keys are refused."""
    unknown = sorted(set(raw) - set(DEFAULTS) - {"submitter", "priority"})
    if unknown:
        raise SpecError(f"unknown spec field {unknown[0]!r}")
    spec = {**DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}
    try:
        for key in ("height", "width", "frames", "seed"):
            spec[key] = int(spec[key])
        spec["frame_rate"] = float(spec["frame_rate"])
    except (TypeError, ValueError) as exc:
        raise SpecError(f"bad number in spec: {exc}") from exc
    return spec


def estimate_peak_bytes(spec: dict) -> int:
    """A coarse upper estimate of a worker's peak memory for the untiled stage 2 and decode."""
    tokens = latent_frames(spec["frames"]) * (spec["height"] // 32) * (spec["width"] // 32)
    decode = spec["frames"] * spec["height"] * spec["width"] * 3 * 4 * 24
    return tokens * 4096 * 2 * 64 + decode


def validate_spec(spec: dict, fleet: list[dict]) -> None:
    """Refuse what cannot render, with one line that says why. `fleet`: registered workers' capabilities."""
    if not str(spec.get("prompt", "")).strip():
        raise SpecError("prompt is empty: give one with -p/--prompt")
    for key in ("height", "width"):
        value = spec[key]
        if value <= 0 or value % 64:
            raise SpecError(f"{key} {value} is not a positive multiple of 64 (two-stage renders halve it for stage 1)")
        if value > MAX_SIDE:
            raise SpecError(f"{key} {value} is beyond the model's {MAX_SIDE} px positional range")
    frames = spec["frames"]
    if frames < 1 or (frames - 1) % TEMPORAL_FACTOR:
        raise SpecError(f"frames {frames} is not of the form 8k+1 (e.g. 25, 49, 97, 121)")
    if frames > MAX_FRAMES or frames / spec["frame_rate"] > MAX_SECONDS:
        raise SpecError(f"{frames} frames at {spec['frame_rate']} fps exceed the model's {MAX_SECONDS:.0f} s range")
    if spec["frame_rate"] <= 0:
        raise SpecError("frame rate must be positive")
    if spec["seed"] < 0:
        raise SpecError(f"seed {spec['seed']} is negative")
    image = spec.get("image")
    if image is not None:
        if not isinstance(image, dict) or not image.get("blob"):
            raise SpecError("image condition has no uploaded image")
        if not 0 <= int(image.get("frame", 0)) < frames:
            raise SpecError(f"image frame {image.get('frame')} is outside 0..{frames - 1}")
        if not 0.0 <= float(image.get("strength", 1.0)) <= 1.0:
            raise SpecError(f"image strength {image.get('strength')} is outside [0, 1]")
    _check_fleet(spec, fleet)
    _check_tiling(spec, fleet)


def _check_tiling(spec: dict, fleet: list[dict]) -> None:
    """Resolve `auto` against the fleet (recorded in the spec) and refuse tilings that cannot split."""
    if spec.get("stage2_tiles") is None:
        return
    holders = [w for w in fleet if spec["pack"] in (w.get("packs") or [])]
    try:
        counts = tdp.parse_tile_counts(str(spec["stage2_tiles"]), len(holders))
        grid = (latent_frames(spec["frames"]), spec["height"] // SPATIAL_FACTOR, spec["width"] // SPATIAL_FACTOR)
        tdp.plan(grid, counts, int(spec["tile_overlap"]))
    except ValueError as exc:
        raise SpecError(f"stage-2 tiling: {exc}") from exc
    spec["stage2_tiles"] = "x".join(str(n) for n in counts)
    sigmas = spec.get("stage2_sigmas")
    if sigmas is not None and (len(sigmas) < 2 or float(sigmas[-1]) != 0.0):
        raise SpecError("stage-2 sigmas must have at least two values and end with 0")


def _check_fleet(spec: dict, fleet: list[dict]) -> None:
    if not fleet:
        return  # nobody registered yet: the render waits for workers
    holders = [w for w in fleet if spec["pack"] in (w.get("packs") or [])]
    if not holders:
        raise SpecError(f"unknown pack {spec['pack']!r}: no registered worker has it")
    largest = max(int(w.get("memory_bytes") or 0) for w in holders)
    need = estimate_peak_bytes(spec)
    if largest and need > largest:
        raise SpecError(
            f"{spec['width']}x{spec['height']}x{spec['frames']} needs ~{need / 2**30:.1f} GiB on one worker; "
            f"the largest holding {spec['pack']!r} has {largest / 2**30:.1f} GiB"
        )


def latent_frames(frames: int) -> int:
    return (frames - 1) // TEMPORAL_FACTOR + 1


def audio_latent_frames(frames: int, fps: float, latents_per_second: float = 25.0) -> int:
    """Audio latent length for the clip's duration (16 kHz / hop 160 / downsample 4 = 25 per second)."""
    return round(frames / fps * latents_per_second)


def _ref(task: str, output: str) -> dict:
    return {"task": task, "output": output}


def _task(render_id: str, name: str, kind: str, params: dict, inputs: dict) -> dict:
    deps = sorted({ref["task"] for ref in inputs.values() if "task" in ref})
    return {"id": f"{render_id}.{name}", "kind": kind, "params": params, "inputs": inputs, "deps": deps,
            "capability": CAPABILITY}


def _expect(dtype: str, *shape: int) -> dict:
    return {"dtype": dtype, "shape": list(shape)}


def plan_render(spec: dict, render_id: str) -> list[dict]:
    """The distilled two-stage text/image-to-video graph with audio, in a topological order."""
    rid = render_id
    pack, seed, fps = spec["pack"], spec["seed"], spec["frame_rate"]
    f_lat = latent_frames(spec["frames"])
    h2, w2 = spec["height"] // 2, spec["width"] // 2
    text_id = f"{rid}.text"
    ctx = {k: _ref(text_id, k) for k in ("video_context", "audio_context", "context_mask")}
    tasks = [_task(rid, "text", "text_encode", {"pack": pack, "prompt": spec["prompt"],
                   "expect": {k: _expect("float32") for k in ctx}}, {})]
    image = spec.get("image")
    cond1, cond2 = {}, {}
    if image:
        for name, (h, w) in (("image_s1", (h2, w2)), ("image_s2", (spec["height"], spec["width"]))):
            tasks.append(_task(rid, name, "image_encode", {
                "pack": pack, "height": h, "width": w,
                "expect": {"latent": _expect("float32", 1, -1, 1, h // SPATIAL_FACTOR, w // SPATIAL_FACTOR)}},
                {"image": {"blob": image["blob"]}}))
        cond1 = {"image_latent": _ref(f"{rid}.image_s1", "latent")}
        cond2 = {"image_latent": _ref(f"{rid}.image_s2", "latent")}
    image_params = {"image_frame": int(image.get("frame", 0)), "image_strength": float(image.get("strength", 1.0))} if image else {}
    a_lat = audio_latent_frames(spec["frames"], fps)
    shape1 = (1, -1, f_lat, h2 // SPATIAL_FACTOR, w2 // SPATIAL_FACTOR)
    shape2 = (1, -1, f_lat, spec["height"] // SPATIAL_FACTOR, spec["width"] // SPATIAL_FACTOR)
    tasks.append(_task(rid, "stage1", "denoise_stage1", {
        "pack": pack, "seed": seed, "frames": spec["frames"], "fps": fps, "height": h2, "width": w2,
        "sigmas": list(DISTILLED_SIGMAS), "audio_frames": a_lat, **image_params,
        "expect": {"video_latent": _expect("float32", *shape1), "audio_latent": _expect("float32", 1, -1, a_lat, -1)}},
        {**ctx, **cond1}))
    s1 = f"{rid}.stage1"
    tasks.append(_task(rid, "upsample", "upsample_spatial", {
        "pack": pack, "expect": {"latent": _expect("float32", *shape2)}}, {"latent": _ref(s1, "video_latent")}))
    stage2_params = {"pack": pack, "seed": seed, "frames": spec["frames"], "fps": fps, "height": spec["height"],
                     "width": spec["width"], "sigmas": stage2_sigmas(spec), "audio_frames": a_lat,
                     "noise_stream": 1, **image_params}
    stage2_inputs = {**cond2, "latent": _ref(f"{rid}.upsample", "latent"), "audio_latent": _ref(s1, "audio_latent")}
    if spec.get("stage2_tiles") is None:
        tasks.append(_task(rid, "stage2", "denoise_stage2", {
            **stage2_params, "expect": {"video_latent": _expect("float32", *shape2)}}, {**ctx, **stage2_inputs}))
    else:
        tasks.extend(plan_tiled_stage2(rid, spec, stage2_params, stage2_inputs, ctx))
    tasks.append(_task(rid, "decode", "decode_video", {
        "pack": pack, "product": "video",
        "expect": {"frames": _expect("float32", spec["frames"], spec["height"], spec["width"], 3)}},
        {"latent": _ref(f"{rid}.stage2", "video_latent")}))
    if spec.get("audio", True):
        tasks.append(_task(rid, "audio", "decode_audio", {
            "pack": pack, "product": "audio", "expect": {"waveform": _expect("float32", -1, -1),
                                                         "sample_rate": _expect("int32", 1)}},
            {"latent": _ref(s1, "audio_latent")}))
    return tasks


def stage2_sigmas(spec: dict) -> list[float]:
    """Explicit --stage2-sigmas; else upstream's TDP schedule when tiled, the distilled one when not."""
    if spec.get("stage2_sigmas"):
        return [float(x) for x in spec["stage2_sigmas"]]
    tiled = spec.get("stage2_tiles") not in (None, "1x1", "1x1x1")
    return list(TDP_STAGE_2_SIGMAS if tiled else STAGE_2_DISTILLED_SIGMAS)


def plan_tiled_stage2(rid: str, spec: dict, params: dict, inputs: dict, ctx: dict) -> list[dict]:
    """Stage 2 as steps of per-tile forwards (workers) and blends + sampler steps (the coordinator)."""
    grid = (latent_frames(spec["frames"]), spec["height"] // SPATIAL_FACTOR, spec["width"] // SPATIAL_FACTOR)
    counts = tdp.parse_tile_counts(spec["stage2_tiles"])
    tiles = tdp.plan(grid, counts, int(spec["tile_overlap"]))
    geometry = {"grid": list(grid), "counts": list(counts), "overlap": int(spec["tile_overlap"]), "sigmas": params["sigmas"]}
    prep, cut = f"{rid}.stage2.prep", f"{rid}.stage2.cut"
    state = ("latent", "clean", "mask", "positions")
    audio = {k: _ref(prep, k) for k in ("audio_latent", "audio_mask", "audio_positions")}
    tasks = [_task(rid, "stage2.prep", "stage_prepare", {**params, "expect": {}}, inputs),
             _task(rid, "stage2.cut", "tdp_cut", {**geometry, "expect": {}}, {k: _ref(prep, k) for k in state[1:]}
                   | {"latent": _ref(prep, "latent")})]
    tasks[-1]["capability"] = COORDINATOR
    source, latent_src = cut, prep
    steps = len(params["sigmas"]) - 1
    for step in range(steps):
        for tile in tiles:
            tile_in = {k: _ref(source, f"t{tile.index}_{k}") for k in ("latent", "timesteps", "positions")}
            info = {"step": step, "tile_index": tile.index, "grid": list(grid), "tile": {
                axis: [iv.start, iv.end] for axis, iv in zip(("frames", "height", "width"), tile.intervals, strict=True)}}
            tasks.append(_task(rid, f"stage2.s{step}.t{tile.index}", "transformer_forward", {
                "pack": params["pack"], "sigma": float(params["sigmas"][step]), **info,
                "expect": {"velocity": _expect("float32", 1, -1, -1)}}, {**tile_in, **audio, **ctx}))
        last = step == steps - 1
        name = "stage2" if last else f"stage2.s{step}"
        step_in = {f"v{t.index}": _ref(f"{rid}.stage2.s{step}.t{t.index}", "velocity") for t in tiles}
        step_in |= {k: _ref(prep, k) for k in state[1:]} | {"latent": _ref(latent_src, "latent")}
        tasks.append(_task(rid, name, "tdp_step", {**geometry, "step": step, "expect": {}}, step_in))
        tasks[-1]["capability"] = COORDINATOR
        source = latent_src = f"{rid}.{name}"
    return tasks


def product_outputs() -> dict[str, tuple[str, str]]:
    """Which task output feeds which product: product name → (task name suffix, output name)."""
    return {"video": ("decode", "frames"), "audio": ("audio", "waveform"), "audio_rate": ("audio", "sample_rate")}


def stage_latent_outputs() -> dict[str, tuple[str, str]]:
    """The latents `--save-latents` writes, by file stem → (task name suffix, output name)."""
    return {"stage1_video": ("stage1", "video_latent"), "stage1_audio": ("stage1", "audio_latent"),
            "upsampled": ("upsample", "latent"), "stage2_video": ("stage2", "video_latent")}
