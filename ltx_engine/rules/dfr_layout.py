"""DFR (LTX-2.5) temporal layout: keyframe canvas, per-round tile plans, the latent stitch.

Pure python/numpy. The planner turns a render spec into per-tile tasks with these plans and the
in-process path runs the same plans, so the stitched latent is identical either way. Facts follow the
reference dfr_layout / dfr_pipeline (1.2.0): segments of 24 or 32 pixel frames, 2**r tiles over whole
segments, the earlier tile keeps the shared seam latent. A non-first tile's lead-in follows upstream's
`TilePrefix` (after 1.2.0; the epilogue windows' rule, `tile_prefix`, one implementation): it starts on
the last keyframe plane before its seam (the previous tile's new slot at the midpoint of the segment
before the seam), and that plane plus the previous tile's output cells up to the seam are pinned
(strength 1), so the tiles of a round run one after another, each continuing the one before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ltx_engine.rules.sampling import DISTILLED_SIGMAS

SEGMENT_CANDIDATES: tuple[int, ...] = (24, 32)
TEMPORAL_SCALE = 8
MAX_ROUNDS = 2
ANCHOR_STRENGTH = 0.95
ANCESTRAL_ETA = 0.5
ROUND_SEED_STRIDE = 1000
MAX_CONDITIONING_FPS = 60.0
SNAP_CONDITIONING_FPS_ABOVE = 30.0
TEMPORAL_SIGMAS: tuple[float, ...] = DISTILLED_SIGMAS[4:]


def choose_segment_length(content_frames: int) -> int:
    """Segment from SEGMENT_CANDIDATES padding `content_frames` (= frames - 1) least; larger on a tie."""
    if content_frames < 1:
        raise ValueError(f"content_frames must be >= 1, got {content_frames}")
    best, best_pad = 0, None
    for seg in SEGMENT_CANDIDATES:
        pad = (-content_frames) % seg
        if best_pad is None or pad < best_pad or (pad == best_pad and seg > best):
            best, best_pad = seg, pad
    return best


def _check_frames(num_frames: int) -> None:
    if num_frames < 2:
        raise ValueError(f"num_frames must be >= 2 for a DFR canvas, got {num_frames}")
    if (num_frames - 1) % TEMPORAL_SCALE != 0:
        raise ValueError(
            f"num_frames must satisfy (num_frames - 1) % {TEMPORAL_SCALE} == 0, got {num_frames}"
        )


@dataclass(frozen=True)
class Canvas:
    """Padded canvas: `frames` pixel frames, keyframe slots at every segment boundary (frame 0 excluded)."""

    requested_frames: int
    frames: int
    segment: int
    slots: tuple[int, ...]

    @property
    def latent_frames(self) -> int:
        return (self.frames - 1) // TEMPORAL_SCALE + 1


def resolve_canvas(num_frames: int) -> Canvas:
    """Pad frames-1 up to a whole number of segments; slots [S, 2S, ..., frames'-1]."""
    _check_frames(num_frames)
    content = num_frames - 1
    seg = choose_segment_length(content)
    padded = content + (-content) % seg
    return Canvas(num_frames, padded + 1, seg, tuple(seg * i for i in range(1, padded // seg + 1)))


def pixel_to_latent(pixel_frame: int) -> int:
    """Latent index of a pixel frame on the x8 border (frame 0 -> 0, 8k -> k)."""
    if pixel_frame < 0 or pixel_frame % TEMPORAL_SCALE != 0:
        raise ValueError(f"pixel frame {pixel_frame} is not on the x{TEMPORAL_SCALE} latent border")
    return pixel_frame // TEMPORAL_SCALE


@dataclass(frozen=True)
class DfrTile:
    """One temporal tile of a round, in global coordinates (pixel_end inclusive, latent_end exclusive).

    anchors: seam keyframes the tile denoises towards (conditioning at ANCHOR_STRENGTH, after its pinned
    prefix); slots: new keyframe slots at the midpoints of the segments it owns; pinned: its prefix cells
    (0 for the first tile; else the plane at pixel_start, then the previous tile's cells up to the seam),
    which are also the latents dropped when stitching.
    """

    index: int
    pixel_start: int
    pixel_end: int
    latent_start: int
    latent_end: int
    anchors: tuple[int, ...]
    slots: tuple[int, ...]
    pinned: int
    noise_seed: int

    @property
    def drop_latent_prefix(self) -> int:
        """Latents the stitch drops: the pinned prefix (the earlier tile keeps the seam latent)."""
        return self.pinned

    @property
    def resume(self) -> int:
        """The first pixel frame the tile denoises (after its pinned prefix, which ends on the seam)."""
        return self.pixel_start + (self.pinned - 1) * TEMPORAL_SCALE + 1 if self.pinned else self.pixel_start

    @property
    def latent_frames(self) -> int:
        return self.latent_end - self.latent_start

    @property
    def local_frames(self) -> int:
        """Pixel frames the tile denoises: (latents - 1) * 8 + 1."""
        return (self.latent_frames - 1) * TEMPORAL_SCALE + 1

    @property
    def local_anchors(self) -> tuple[int, ...]:
        return tuple(p - self.pixel_start for p in self.anchors)

    @property
    def local_slots(self) -> tuple[int, ...]:
        return tuple(p - self.pixel_start for p in self.slots)


@dataclass(frozen=True)
class RoundPlan:
    """Temporal round r: frames and fps after the x2 upsample, its seams and independent tiles."""

    round: int
    frames: int
    fps: float
    seams: tuple[int, ...]
    tiles: tuple[DfrTile, ...]
    sigmas: tuple[float, ...] = TEMPORAL_SIGMAS
    eta: float = ANCESTRAL_ETA
    anchor_strength: float = ANCHOR_STRENGTH

    @property
    def latent_frames(self) -> int:
        return (self.frames - 1) // TEMPORAL_SCALE + 1

    @property
    def conditioning_fps(self) -> float:
        """RoPE time base: playback fps above 30 snaps to 60 (rates the model never saw, like 48, cannot
        lay out 8 pixel frames per latent); at or below 30 it is the playback fps."""
        return MAX_CONDITIONING_FPS if self.fps > SNAP_CONDITIONING_FPS_ABOVE else self.fps

    def new_slots(self) -> tuple[int, ...]:
        """Slots this round invents, deduplicated (the earlier tile's copy wins), sorted."""
        return tuple(sorted({p for tile in self.tiles for p in tile.slots}))

    def carry(self) -> tuple[int, ...]:
        """Keyframe positions carried into the next round (on this round's grid): seams + new slots."""
        return tuple(sorted(set(self.seams) | set(self.new_slots())))


def tile_image_frame(tile: DfrTile, frame: int) -> int | None:
    """Where an image at `frame` conditions a tile, tile-local, as upstream re-attaches images per tile:
    every image on the first tile (its window starts at frame 0), else only one inside the frames it
    denoises (its pinned prefix is the previous tile's)."""
    if tile.pixel_start == 0:
        return frame
    return frame - tile.pixel_start if tile.resume <= frame <= tile.pixel_end else None


def tile_prefix(seam: int, planes: Sequence[int]) -> tuple[int, int]:
    """(plane frame, pinned cells) of a tile or window whose seam is pixel frame `seam` (upstream
    `TilePrefix` / `tile_prefix`): the last plane before the seam, and 1 + (seam - plane) / 8 cells."""
    before = [int(p) for p in planes if p < seam]
    if not before:
        raise ValueError(f"no keyframe plane before seam {seam} to start the window on")
    plane = max(before)
    if plane % TEMPORAL_SCALE or seam % TEMPORAL_SCALE:
        raise ValueError(f"plane {plane} and seam {seam} must sit on the x{TEMPORAL_SCALE} border")
    return plane, 1 + (seam - plane) // TEMPORAL_SCALE


def carried_cells(previous: np.ndarray, previous_first: int, plane: np.ndarray, plane_cell: int,
                  pinned: int) -> np.ndarray:
    """The pinned prefix (upstream `lead_in_carryover`): the plane, then the previous tile's or window's
    output (its cell 0 = canvas cell `previous_first`) from the canvas cell after the plane's up to the
    seam, `pinned` cells in all."""
    offset, video = plane_cell + 1 - previous_first, pinned - 1
    if offset < 0 or offset + video > previous.shape[2]:
        raise ValueError(
            f"pinned cells [{plane_cell + 1}, {plane_cell + 1 + video}) fall outside the previous output "
            f"(cell 0 = canvas cell {previous_first}, {previous.shape[2]} cells)"
        )
    return np.concatenate(
        [plane.astype(np.float32), previous[:, :, offset : offset + video].astype(np.float32)], axis=2
    )


def round_tile_prefix(plan: RoundPlan, tile: DfrTile, previous: np.ndarray | None,
                      previous_slots: np.ndarray | None, carry: np.ndarray) -> np.ndarray | None:
    """A round tile's pinned prefix from the tile before it (its window latent and new slots) and the
    round's carried keyframes (one per seam): its plane, then the previous tile's cells up to the seam;
    None for the first tile."""
    if not tile.pinned:
        return None
    before, at = plan.tiles[tile.index - 1], tile.pixel_start
    if previous is None or previous_slots is None:
        raise ValueError(f"tile {tile.index} pins {tile.pinned} cells on tile {before.index}: give its outputs")
    if at in before.slots:
        k = before.slots.index(at)
        plane = previous_slots[:, :, k : k + 1]
    elif at in plan.seams:
        k = plan.seams.index(at)
        plane = carry[:, :, k : k + 1]
    else:
        raise ValueError(f"tile {tile.index}'s plane at frame {at} is no seam nor slot of tile {before.index}")
    return carried_cells(previous, before.latent_start, plane, tile.latent_start, tile.pinned)


def _owned_counts(n_segments: int, n_tiles: int) -> list[int]:
    base, extra = divmod(n_segments, n_tiles)
    return [base + (1 if i < extra else 0) for i in range(n_tiles)]


def _check_seams(seams: Sequence[int], frames: int) -> list[int]:
    if not seams:
        raise ValueError("seams must be non-empty")
    if seams[-1] != frames - 1:
        raise ValueError(f"last seam must be the terminal frame {frames - 1}, got {seams[-1]}")
    bounds = [0, *(int(s) for s in seams)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        if b <= a:
            raise ValueError(f"seams must be strictly increasing, got {list(seams)}")
        if (b - a) % TEMPORAL_SCALE != 0:
            raise ValueError(f"segment [{a}, {b}] is not a multiple of {TEMPORAL_SCALE} frames")
        if (b - a) // TEMPORAL_SCALE < 2:
            raise ValueError(f"segment [{a}, {b}] is under 2 latent frames, too short for a tile lead-in")
    return bounds


def _build_tile(bounds: list[int], own_lo: int, own_hi: int, index: int, seed: int,
                planes: Sequence[int]) -> DfrTile:
    """Tile `index` owning segments [own_lo, own_hi); a non-first one starts on its prefix's plane (the
    last of `planes`, the round's seams and the earlier tiles' slots, before its seam)."""
    plane, pinned = tile_prefix(bounds[own_lo], planes) if own_lo > 0 else (0, 0)
    pixel_end = bounds[own_hi]
    return DfrTile(
        index=index,
        pixel_start=plane,
        pixel_end=pixel_end,
        latent_start=pixel_to_latent(plane),
        latent_end=pixel_to_latent(pixel_end) + 1,
        anchors=tuple(bounds[i] for i in range(own_lo + 1, own_hi + 1)),
        slots=tuple((bounds[i] + bounds[i + 1]) // 2 for i in range(own_lo, own_hi)),
        pinned=pinned,
        noise_seed=seed,
    )


def plan_round(round_index: int, seams: Sequence[int], frames: int, fps: float, seed: int) -> RoundPlan:
    """Tiles of round r: 2**r over whole segments (clamped to the segment count), extras to leading tiles."""
    if not 1 <= round_index <= MAX_ROUNDS:
        raise ValueError(f"round must be in 1..{MAX_ROUNDS}, got {round_index}")
    _check_frames(frames)
    bounds = _check_seams(seams, frames)
    n_segments = len(bounds) - 1
    tiles, own_lo = [], 0
    for i, count in enumerate(_owned_counts(n_segments, min(2**round_index, n_segments))):
        tile_seed = seed + ROUND_SEED_STRIDE * round_index + i
        planes = [*bounds[1:], *(p for t in tiles for p in t.slots)]
        tiles.append(_build_tile(bounds, own_lo, own_lo + count, i, tile_seed, planes))
        own_lo += count
    return RoundPlan(round_index, frames, fps, tuple(int(s) for s in seams), tuple(tiles))


@dataclass(frozen=True)
class DfrPlan:
    """The whole DFR layout of a render: canvas, the rounds in order, and the trimmed output."""

    canvas: Canvas
    fps: float
    rounds: tuple[RoundPlan, ...]

    @property
    def output_frames(self) -> int:
        """(requested - 1) * 2**R + 1 pixel frames."""
        return (self.canvas.requested_frames - 1) * 2 ** len(self.rounds) + 1

    @property
    def output_fps(self) -> float:
        return self.fps * 2 ** len(self.rounds)

    @property
    def output_latent_frames(self) -> int:
        """Latent frames kept after trimming the padded canvas."""
        return (self.output_frames - 1) // TEMPORAL_SCALE + 1

    @property
    def final_frames(self) -> int:
        """Pixel frames of the generated (untrimmed) canvas after the last round."""
        return self.rounds[-1].frames if self.rounds else self.canvas.frames


def plan_dfr(num_frames: int, fps: float, rounds: int, seed: int) -> DfrPlan:
    """Canvas plus every round: N -> 2(N-1)+1 frames, fps x2, seams = 2 x previous carry."""
    if not 0 <= rounds <= MAX_ROUNDS:
        raise ValueError(f"temporal rounds must be 0..{MAX_ROUNDS}, got {rounds}")
    if fps <= 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    canvas = resolve_canvas(num_frames)
    frames, cur_fps, carry = canvas.frames, float(fps), canvas.slots
    plans: list[RoundPlan] = []
    for r in range(1, rounds + 1):
        frames, cur_fps = 2 * (frames - 1) + 1, 2 * cur_fps
        plan = plan_round(r, [2 * p for p in carry], frames, cur_fps, seed)
        plans.append(plan)
        carry = plan.carry()
    out = DfrPlan(canvas, float(fps), tuple(plans))
    if out.output_frames > out.final_frames:
        raise ValueError(f"output {out.output_frames} frames exceeds the canvas {out.final_frames}")
    return out


def stitch_round(tile_latents: Sequence[np.ndarray], plan: RoundPlan) -> np.ndarray:
    """Concatenate (B, C, T, H, W) tile latents along T, each from its drop_latent_prefix on."""
    if len(tile_latents) != len(plan.tiles):
        raise ValueError(f"expected {len(plan.tiles)} tile latents, got {len(tile_latents)}")
    pieces = []
    for lat, tile in zip(tile_latents, plan.tiles, strict=True):
        if lat.ndim != 5:
            raise ValueError(f"tile latent must be (B, C, T, H, W), got {lat.shape}")
        if lat.shape[2] != tile.latent_frames:
            raise ValueError(
                f"tile {tile.index} latent T={lat.shape[2]} != {tile.latent_frames} "
                f"for [{tile.latent_start}, {tile.latent_end})"
            )
        pieces.append(lat[:, :, tile.drop_latent_prefix :])
    out = np.concatenate(pieces, axis=2)
    if out.shape[2] != plan.latent_frames:
        raise ValueError(f"stitched T={out.shape[2]} != round latent frames {plan.latent_frames}")
    return out


def trim_latent(latent: np.ndarray, plan: DfrPlan) -> np.ndarray:
    """Cut the padded tail so the latent decodes to exactly plan.output_frames frames."""
    return latent[:, :, : plan.output_latent_frames]


def plan_params(num_frames: int, fps: float, rounds: int, seed: int) -> dict:
    """What a task carries to name its DFR plan; `plan_from_params` rebuilds the very same plan."""
    return {"frames": int(num_frames), "fps": float(fps), "rounds": int(rounds), "seed": int(seed)}


def plan_from_params(params: dict) -> DfrPlan:
    """The DFR plan a task's params["dfr"] names (workers and the reducer derive it, never re-derive it)."""
    return plan_dfr(int(params["frames"]), float(params["fps"]), int(params["rounds"]), int(params["seed"]))
