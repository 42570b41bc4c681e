"""The decode end of the graph: the final video latent becomes frames. Pure.

Untiled: one `decode_video` task whose frames are the product "video". Tiled: one `decode_tile` task
per decode tile (any worker, all at once); the assembler blends their raw pixels in tile order and
streams finished frames to the encoder. `decode_tiles` is "auto" until validation resolves it against
the fleet to "off" or "F,H,W" (pixel tile sizes, in the resolved plan), so the farm and `--local` can
run the same plan.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from coordinator.plan import costs, diffusion_decode
from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import SPATIAL_FACTOR, TEMPORAL_FACTOR, SpecError, expect, latent_grid, task
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.decode_tiling import (
    DecodeTile,
    DecodeTileSizes,
    latent_tile_sizes,
    split_symmetric,
    split_temporal_causal,
    tile_size_problem,
    tiles_from_axes,
)
from ltx_engine.rules.tiling import Interval

Keyframes = Callable[..., tuple[dict, dict]]  # (pixel frames [lo, hi] | None) -> (params, inputs)

DEFAULT_SIZES = DecodeTileSizes()  # the reference's 80 / 24 frames, 768 / 64 px
OVERLAP_FRAMES = DEFAULT_SIZES.frames_overlap
OVERLAP_PX = DEFAULT_SIZES.spatial_overlap
BYTES_PER_PIXEL = 3 * 4 * 24  # the planner's coarse decode working-set factor per output pixel
DECODE = "decode"
TILE_PRODUCT = "video_tiles"


def tile_task_name(index: int) -> str:
    return f"{DECODE}.t{index}"


def shipped_frames(spec: RenderPlan) -> int:
    """Frames the decode produces: the clip's, or what DFR rounds lengthen it to (spec.output_frames)."""
    return spec.output_frames or spec.frames


def parse_decode_tiles(value: object) -> tuple[int, int, int] | None:
    """"off" → None; "F,H,W" → checked pixel sizes. A tile must be larger than its overlap."""
    text = str(value).strip().lower()
    if text == "off":
        return None
    try:
        sizes = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        sizes = ()
    if len(sizes) != 3:
        raise SpecError(f"decode tiles {value!r}: give auto, off or F,H,W (pixels), e.g. 80,768,768")
    problem = tile_size_problem(sizes, (OVERLAP_FRAMES, OVERLAP_PX, OVERLAP_PX),
                                (TEMPORAL_FACTOR, SPATIAL_FACTOR, SPATIAL_FACTOR))
    if problem:
        raise SpecError(f"decode tiles {value}: {problem}")
    return sizes  # type: ignore[return-value]


def tile_plan(grid: tuple[int, int, int], sizes: tuple[int, int, int]) -> list[DecodeTile]:
    """Decode tiles of a latent grid for pixel tile sizes (F, H, W), with the reference's overlaps,
    causal time split and pixel mapping; numbered frames → height → width."""
    f, h, w = grid
    t_size, h_size, w_size = sizes[0] // TEMPORAL_FACTOR, sizes[1] // SPATIAL_FACTOR, sizes[2] // SPATIAL_FACTOR
    t_ov, s_ov = OVERLAP_FRAMES // TEMPORAL_FACTOR, OVERLAP_PX // SPATIAL_FACTOR
    t_ivs = [Interval(0, f, 0, 0)] if f <= t_size else split_temporal_causal(t_size, t_ov, f)
    return tiles_from_axes((t_ivs, split_symmetric(h_size, s_ov, h), split_symmetric(w_size, s_ov, w)))


def decode_tile_plan(spec: RenderPlan) -> list[DecodeTile] | None:
    """The spec's decode tiles, or None when the decode is one task (off, or the plan is one tile)."""
    if diffusion_decode.is_diffusion(spec):  # its own sizes and overlaps
        return diffusion_decode.diffusion_tile_plan(spec, latent_grid(spec))
    value = spec.decode_tiles
    sizes = parse_decode_tiles(default_sizes(spec) if value == "auto" else value)
    if sizes is None:
        return None
    tiles = tile_plan(latent_grid(spec), sizes)
    return tiles if len(tiles) > 1 else None


def default_sizes(spec: RenderPlan) -> str:
    """The reference's default tile sizes for this clip (spatial sizes scaled from the long side)."""
    t, _, h, w = latent_tile_sizes(latent_grid(spec), DEFAULT_SIZES)
    return f"{t * TEMPORAL_FACTOR},{h * SPATIAL_FACTOR},{w * SPATIAL_FACTOR}"


def decode_peak_bytes(spec: RenderPlan) -> int:
    """A coarse estimate of a worker's decode working set: the largest tile, or the whole clip."""
    tiles = decode_tile_plan(spec)
    if tiles is None:
        return shipped_frames(spec) * spec.height * spec.width * BYTES_PER_PIXEL
    return max(f * h * w for f, h, w in (t.pixel_shape for t in tiles)) * BYTES_PER_PIXEL


def resolve_decode_tiles(spec: RenderPlan, fleet: Fleet) -> str:
    """"auto" made "off" or sizes (the resolved plan records it); bad sizes refused before anything queues.

    auto tiles when more than one worker holds the pack and the clip is larger than one of the reference's
    tiles (the tiles decode in parallel: sized for the holders, `fleet_sizes`), or when the untiled decode
    would not fit the smallest holder's memory (then the reference's tiles shrink until one fits).
    """
    if diffusion_decode.is_diffusion(spec):
        return diffusion_decode.resolve_tiles(spec, fleet)
    value = spec.decode_tiles.strip().lower()
    if value != "auto":
        parse_decode_tiles(value)
        return value
    holders = fleet.holders(spec.pack)
    budget = min(holders.memories(), default=0)
    untiled = shipped_frames(spec) * spec.height * spec.width * BYTES_PER_PIXEL
    if len(holders) <= 1 and (not budget or untiled <= budget):
        return "off"
    tiles = default_sizes(spec)
    if len(holders) > 1 and decode_tile_plan(spec.resolve(decode_tiles=tiles)) is not None:
        tiles = fleet_sizes(spec, len(holders), budget) or tiles
    while budget and decode_peak_bytes(spec.resolve(decode_tiles=tiles)) > budget:
        smaller = _shrink(parse_decode_tiles(tiles))  # type: ignore[arg-type]
        if smaller is None:
            raise SpecError(f"the decode needs ~{decode_peak_bytes(spec.resolve(decode_tiles=tiles)) / 2**30:.1f} "
                            f"GiB per tile even at the smallest tiles; the smallest worker has {budget / 2**30:.1f} GiB")
        tiles = ",".join(str(x) for x in smaller)
    return tiles


MIN_GAIN = 0.05  # a split with more tiles must shorten the modelled decode by this much


def fleet_sizes(spec: RenderPlan, workers: int, budget: int) -> str | None:
    """The tile sizes ("F,H,W") for `workers` holders: of the splits with at most as many tiles as the
    reference's (or one per holder) whose largest tile fits `budget`, the one whose decode, its tiles
    dealt to the first free holder (costs.reference_seconds each), ends first; more tiles only for
    MIN_GAIN of it. Why: the reference's sizes bound one GPU's memory; on a fleet a tile past one per
    holder only adds overlap (a 1088x1920x121 clip: 18 tiles, 1.5x the untiled pixels, on 4 Macs; 2x2,
    1.1x); None when no split fits."""
    grid = latent_grid(spec)
    cap = max(workers, len(tile_plan(grid, parse_decode_tiles(default_sizes(spec)))))  # type: ignore[arg-type]
    best: tuple[float, tuple[int, int, int]] | None = None
    for sizes in _splits(grid, cap):
        tiles = tile_plan(grid, sizes)
        if budget and max(f * h * w for f, h, w in (t.pixel_shape for t in tiles)) * BYTES_PER_PIXEL > budget:
            continue
        ends = _dealt(tiles, workers)
        if best is None or ends < best[0] * (1 - MIN_GAIN):
            best = ends, sizes
    return None if best is None else ",".join(str(x) for x in best[1])


def _splits(grid: tuple[int, int, int], cap: int) -> list[tuple[int, int, int]]:
    """Pixel sizes of each split of at most `cap` tiles, the smallest sizes for each count of tiles per
    axis (the most even tiles), fewest tiles first."""
    f, h, w = grid
    t_ov, s_ov = OVERLAP_FRAMES // TEMPORAL_FACTOR, OVERLAP_PX // SPATIAL_FACTOR
    frames = _per_count(t_ov + 1, f, lambda n: 1 if f <= n else len(split_temporal_causal(n, t_ov, f)))
    heights = _per_count(s_ov + 1, h, lambda n: len(split_symmetric(n, s_ov, h)))
    widths = _per_count(s_ov + 1, w, lambda n: len(split_symmetric(n, s_ov, w)))
    found = [(a * b * c, (ft * TEMPORAL_FACTOR, hs * SPATIAL_FACTOR, ws * SPATIAL_FACTOR))
             for a, ft in frames.items() for b, hs in heights.items() for c, ws in widths.items() if a * b * c <= cap]
    return [sizes for _, sizes in sorted(found)]


def _per_count(smallest: int, length: int, count: Callable[[int], int]) -> dict[int, int]:
    """For each count of tiles along an axis of `length` latents, the smallest latent tile size (from
    `smallest`, the least above the overlap) that gives it; an axis no longer than that is one tile."""
    out: dict[int, int] = {}
    for n in range(smallest, max(smallest, length) + 1):
        out.setdefault(count(n), n)
    return out


def _dealt(tiles: list[DecodeTile], workers: int) -> float:
    """Modelled reference seconds until the last tile is decoded, each tile (in order) to the first free worker."""
    free = [0.0] * max(1, workers)
    for tile in tiles:
        pixels = {"expect": {"pixels": {"shape": [1, 3, *tile.pixel_shape]}}}
        heapq.heappush(free, heapq.heappop(free) + costs.reference_seconds("decode_tile", pixels))
    return max(free)


def _shrink(sizes: tuple[int, int, int]) -> tuple[int, int, int] | None:
    """Halve the largest spatial side (keeping it above its overlap), else the frames; None at the floor."""
    f, h, w = sizes
    axis = 1 if h >= w else 2
    side = sizes[axis] // 2 // SPATIAL_FACTOR * SPATIAL_FACTOR
    if side > OVERLAP_PX:
        return (f, side, w) if axis == 1 else (f, h, side)
    frames = f // 2 // TEMPORAL_FACTOR * TEMPORAL_FACTOR
    return (frames, h, w) if frames > OVERLAP_FRAMES else None


def plan_decode(rid: str, spec: RenderPlan, latent: dict, keyframes: Keyframes | None = None) -> list[dict]:
    """One decode task of the whole latent, or one task per decode tile (all reading the whole latent).
    `keyframes` (a keyframe-aware decode: DFR's planes, `plan/dfr_finish.keyframe_decode_io`) gives each
    task's keyframe params and inputs from its pixel frames [lo, hi] (None: the whole clip)."""
    tiles = decode_tile_plan(spec)
    extra = keyframes or (lambda frames=None: ({}, {}))
    if tiles is None:
        params, inputs = extra()
        return [task(rid, DECODE, "decode_video", {
            "pack": spec.pack, "product": "video", **diffusion_decode.decoder_params(spec), **params,
            "expect": {"frames": expect("float32", shipped_frames(spec), spec.height, spec.width, 3)}},
            {"latent": latent, **inputs})]
    out = []
    for tile in tiles:
        params, inputs = extra((tile.pixel[0][0], tile.pixel[0][1] - 1))
        out.append(task(rid, tile_task_name(tile.index), "decode_tile", {
            "pack": spec.pack, "product": TILE_PRODUCT, "tile_index": tile.index, "tiles": len(tiles),
            **diffusion_decode.decoder_params(spec, tile.index), **params,
            "latent": {axis: [iv.start, iv.end] for axis, iv in zip(("frames", "height", "width"), tile.latent,
                                                                    strict=True)},
            "expect": {"pixels": expect("float32", 1, 3, *tile.pixel_shape)}},
            {"latent": latent, **inputs}))
    return out
