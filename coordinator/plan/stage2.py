"""Stage 2 of the graph as tiled data parallel: per step, one forward per tile on the workers, then a
blend + sampler step by the coordinator's reducer. Pure."""

from __future__ import annotations

import math

from coordinator.plan import costs, placement, samplers
from coordinator.plan.dfr import canvas_frames
from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import (
    CAPABILITY,
    COORDINATOR,
    SPATIAL_FACTOR,
    SpecError,
    expect,
    latent_frames,
    ref,
    task,
)
from coordinator.plan.images import slot_range
from coordinator.plan.resolved import RenderPlan
from coordinator.plan.sparse import cache_inputs
from ltx_engine.rules import step_cache as cache_rule
from ltx_engine.rules import tdp
from ltx_engine.rules.generation import LTX_25
from ltx_engine.rules.sampling import STAGE_2_DISTILLED_SIGMAS, TDP_STAGE_2_SIGMAS


def check_tiling(spec: RenderPlan, fleet: Fleet) -> str | None:
    """The tile counts ("FxHxW", `auto` resolved against the fleet); tilings that cannot split refused."""
    if spec.stage2_tiles is None:
        return None
    holders = fleet.holders(spec.pack)
    try:
        counts = tdp.parse_tile_counts(str(spec.stage2_tiles), len(holders))
        grid = (
            latent_frames(canvas_frames(spec)),
            spec.height // SPATIAL_FACTOR,
            spec.width // SPATIAL_FACTOR,
        )
        try:
            tdp.plan(grid, counts, spec.tile_overlap)
        except ValueError as exc:
            raise ValueError(tiling_in_pixels(spec, grid, counts)) from exc
        if str(spec.stage2_tiles) == "auto":
            counts = fit_smallest(spec, holders, grid, fastest_split(spec, holders, grid, counts))
    except ValueError as exc:
        raise SpecError(f"stage-2 tiling: {exc}") from exc
    sigmas = spec.stage2_sigmas
    if sigmas is not None and (len(sigmas) < 2 or float(sigmas[-1]) != 0.0):
        raise SpecError("stage-2 sigmas must have at least two values and end with 0")
    return "x".join(str(n) for n in counts)


def _most_tiles(grid: tuple[int, int, int], counts: tuple[int, int, int], overlap: int, axis: int) -> int:
    """The most tiles along one axis (the others untiled) that split with this overlap."""
    best = 1
    for n in range(2, counts[axis] + 1):
        trial = [1, 1, 1]
        trial[axis] = n
        try:
            tdp.plan(grid, (trial[0], trial[1], trial[2]), overlap)
        except ValueError:
            break
        best = n
    return best


def tiling_in_pixels(spec: RenderPlan, grid: tuple[int, int, int], counts: tuple[int, int, int]) -> str:
    """Why a tiling does not split, in the pixels the user gave (a latent cell is SPATIAL_FACTOR px), and
    the most tiles that would."""
    overlap = spec.tile_overlap
    most = [_most_tiles(grid, counts, overlap, axis) for axis in range(3)]
    fits = "x".join(str(n) for n in (most[1:] if counts[0] == 1 else most))
    return (f"{spec.stage2_tiles} does not fit {spec.height}x{spec.width} px (height x width): tiles overlap by "
            f"{overlap * SPATIAL_FACTOR} px (--tile-overlap {overlap}, in latent cells of {SPATIAL_FACTOR} px) "
            f"and each must be wider than its overlaps, so at most {fits} tiles fit: give --stage2-tiles {fits}, "
            "a smaller --tile-overlap or a larger frame")


def tile_box(tile: tdp.Tile) -> dict[str, list[int]]:
    """A tile's latent extent per axis, as its task params carry it (and the cost model reads it)."""
    return {axis: [iv.start, iv.end] for axis, iv in zip(("frames", "height", "width"), tile.intervals, strict=True)}


MAX_TILES_PER_WORKER = 4  # past this, more tiles cost more in overlap than the small Mac adds


def _step_seconds(spec: RenderPlan, holders: Fleet, grid: tuple[int, int, int], counts: tuple[int, int, int],
                  pack_bytes: int) -> tuple[float, int]:
    """One step of these tiles on the holders (chip speeds, memory; dealt as lease.lua deals them): its
    predicted seconds (inf when some tile fits no holder) and the largest tile's min_memory_bytes."""
    tiles = tdp.plan(grid, counts, spec.tile_overlap)
    tasks = [{"id": str(t.index), "kind": "transformer_forward", "deps": [], "capability": CAPABILITY,
              "params": {"tile_index": t.index,
                         "cost_s": costs.reference_seconds("transformer_forward", {"tile": tile_box(t)}),
                         "min_memory_bytes": costs.min_memory_bytes(
                             costs.peak_bytes("transformer_forward", {"tile": tile_box(t)}, pack_bytes)),
                         "min_memory_stream_bytes": costs.min_memory_bytes(
                             costs.stream_peak_bytes("transformer_forward", {"tile": tile_box(t)}, pack_bytes))}}
             for t in tiles]
    slots = [placement.Slot(str(i), w.chip, w.memory_bytes) for i, w in enumerate(holders.workers)]
    placed = placement.simulate(tasks, slots)
    need = max(t["params"]["min_memory_bytes"] for t in tasks)
    return (max(p.end for p in placed) if len(placed) == len(tasks) else math.inf), need


def fastest_split(spec: RenderPlan, holders: Fleet, grid: tuple[int, int, int], counts: tuple[int, int, int],
                  ) -> tuple[int, int, int]:
    """`auto`'s rows x columns for its count of tiles: of every factor pair that splits with the overlap,
    the one whose step the cost model ends first on the holders (the balanced one on a tie). Why: a TDP
    step waits for its largest tile, and a frame's shape decides which split keeps that smallest (1920x1088,
    overlap 5, four tiles: 1x4 columns of 34x19 latent cells against 2x2's largest, 20x33)."""
    n, pack_bytes = counts[1] * counts[2], holders.pack_bytes(spec.pack) or 0
    best, best_s = counts, _step_seconds(spec, holders, grid, counts, pack_bytes)[0]
    for rows in (r for r in range(1, n + 1) if n % r == 0 and (1, r, n // r) != counts):
        try:
            seconds = _step_seconds(spec, holders, grid, (1, rows, n // rows), pack_bytes)[0]
        except ValueError:  # too narrow for the overlap
            continue
        if seconds < best_s:
            best, best_s = (1, rows, n // rows), seconds
    return best


def fit_smallest(spec: RenderPlan, holders: Fleet, grid: tuple[int, int, int], counts: tuple[int, int, int],
                 ) -> tuple[int, int, int]:
    """`auto` tiles small enough for the smallest Mac holding the pack (a tile's predicted peak, the cost
    model's, within its usable memory), so every holder can take one: the fleet's own split grown to at
    most MAX_TILES_PER_WORKER per holder, when that step is predicted to end no later than the fleet's
    split (whose big tiles the lease keeps off the small Macs) would."""
    pack_bytes = holders.pack_bytes(spec.pack)
    smallest = min((w.memory_bytes for w in holders.workers), default=0)  # 0: a holder that did not say
    if not pack_bytes or not smallest:
        return counts
    for n in range(counts[1] * counts[2], MAX_TILES_PER_WORKER * len(holders) + 1):
        candidate = (1, *tdp.balanced_tile_split(n))
        try:
            seconds, need = _step_seconds(spec, holders, grid, candidate, pack_bytes)
        except ValueError:
            break
        if need <= smallest:
            return candidate if seconds <= _step_seconds(spec, holders, grid, counts, pack_bytes)[0] else counts
    return counts


def stage2_sigmas(spec: RenderPlan) -> list[float]:
    """Explicit --stage2-sigmas; else upstream's TDP schedule when tiled, the distilled one when not."""
    if spec.stage2_sigmas:
        return [float(x) for x in spec.stage2_sigmas]
    tiled = spec.stage2_tiles not in (None, "1x1", "1x1x1")
    table = list(TDP_STAGE_2_SIGMAS if tiled else STAGE_2_DISTILLED_SIGMAS)
    steps = spec.stage2_steps  # --stage2-steps N keeps the table's last N steps
    return table if steps is None else table[-(int(steps) + 1):]


def _marker_params(spec: RenderPlan, params: dict, grid: tuple[int, int, int]) -> dict:
    """A 2.5 render's tiles read a keyframe marker (the first latent frame, and the stage's slots, DFR's or
    the carried generated ones, whose token range — after the appended image guides, before the IC-LoRA
    reference — the step also reads them out of)."""
    if spec.generation != LTX_25:
        return {}
    slots = slot_range(params, grid)
    return {"marker": True} if slots is None else {"marker": True, "slot_range": slots}


def _forward_task(rid: str, step: int, tile: tdp.Tile, grid: tuple[int, int, int], params: dict, source: str,
                  marker: bool, shared: dict, name: str = "stage2", dit: dict | None = None) -> dict:
    """One tile's forward at one step: its latent, timesteps and positions (and keyframes) out of `source`;
    `dit`: what the recipe's DiT adds to every forward (a dev recipe's distilled LoRA)."""
    tile_in = {k: ref(source, f"t{tile.index}_{k}") for k in ("latent", "timesteps", "positions")}
    if params.get(cache_rule.PARAM) is not None and step > 0:  # the tile's step cache, from its previous step
        tile_in |= cache_inputs(f"{rid}.{name}.s{step - 1}.t{tile.index}")
    if marker:
        tile_in["keyframes"] = ref(source, f"t{tile.index}_keyframes")
    detailing = {k: params[k] for k in ("detailing_lora", "detailing_strength") if k in params}
    detailing |= forward_params(params, step)
    info = {"step": step, "tile_index": tile.index, "grid": list(grid), "tile": tile_box(tile)}
    return task(rid, f"{name}.s{step}.t{tile.index}", "transformer_forward",
                {"pack": params["pack"], "sigma": float(params["sigmas"][step]), **info, **detailing, **(dit or {}),
                 "expect": {"velocity": expect("float32", 1, -1, -1)}},
                {**tile_in, **shared})


def forward_params(params: dict, step: int) -> dict:
    """A tile forward's sparse tau (its step's), compute dtype and step cache, when the render asks for them."""
    out = {"compute_dtype": params["compute_dtype"]} if params.get("compute_dtype") else {}
    if params.get(cache_rule.PARAM) is not None:
        out |= {cache_rule.PARAM: params[cache_rule.PARAM], cache_rule.STEP_PARAM: step,
                cache_rule.STEPS_PARAM: len(params["sigmas"]) - 1}
    if params.get("sparse_attention"):
        out["sparse_tau"] = float(params["sparse_attention"][step])
    return out


def plan_tiled_stage2(rid: str, spec: RenderPlan, params: dict, inputs: dict, ctx: dict,
                      dit: dict | None = None) -> list[dict]:
    """Stage 2 as steps of per-tile forwards (workers) and blends + sampler steps (the coordinator); `dit`:
    what every forward's DiT adds (a dev recipe's distilled LoRA)."""
    grid = (latent_frames(params["frames"]), spec.height // SPATIAL_FACTOR, spec.width // SPATIAL_FACTOR)
    counts = tdp.parse_tile_counts(spec.stage2_tiles)
    tiles = tdp.plan(grid, counts, spec.tile_overlap)
    geometry = {
        "grid": list(grid),
        "counts": list(counts),
        "overlap": spec.tile_overlap,
        "sigmas": params["sigmas"],
        **_marker_params(spec, params, grid),
        **samplers.step_params(params),  # LTX-2.5: the step re-noises ancestrally (plan/samplers.py)
    }
    prep, cut = f"{rid}.stage2.prep", f"{rid}.stage2.cut"
    state = ("latent", "clean", "mask", "positions")
    audio = {k: ref(prep, k) for k in ("audio_latent", "audio_mask", "audio_positions")}
    tasks = [
        task(rid, "stage2.prep", "stage_prepare", {**params, "expect": {}}, inputs),
        task(
            rid,
            "stage2.cut",
            "tdp_cut",
            {**geometry, "expect": {}},
            {k: ref(prep, k) for k in state[1:]} | {"latent": ref(prep, "latent")},
        ),
    ]
    tasks[-1]["capability"] = COORDINATOR
    source, latent_src = cut, prep
    steps = len(params["sigmas"]) - 1
    for step in range(steps):
        tasks += [_forward_task(rid, step, tile, grid, params, source, bool(geometry.get("marker")), {**audio, **ctx},
                                dit=dit) for tile in tiles]
        last = step == steps - 1
        name = "stage2" if last else f"stage2.s{step}"
        step_in = {f"v{t.index}": ref(f"{rid}.stage2.s{step}.t{t.index}", "velocity") for t in tiles}
        step_in |= {k: ref(prep, k) for k in state[1:]} | {"latent": ref(latent_src, "latent")}
        tasks.append(task(rid, name, "tdp_step", {**geometry, "step": step, "expect": {}}, step_in))
        tasks[-1]["capability"] = COORDINATOR
        source = latent_src = f"{rid}.{name}"
    return tasks
