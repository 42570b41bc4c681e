"""Shape rules of LTX-2.5's diffusion video decoder and the farm's tiling of it. Pure (numpy only).

The decoder (`ltx_engine.models.diffusion_decoder`) needs every neighbourhood-attention stage to see at
least its kernel, so small latents are edge-padded first (`min_latent_shape`, upstream's
`all_stages_min_tile_size`), and it replicates the last latent frame `(K_t // 2) * 2` times through
stages 1-4 (NATTEN's last-frame border) before cropping that appendix off the stage-5 context.

The farm tiles the diffusion decode in latent space, like the conv decode: each tile is a whole decode
of its latent slice on any worker, and the tiles are blended in pixels with `decode_tiling`'s masks,
causal time split and x8 / x32 mappings. Its own sizes and overlaps are the MLX port's
`--diffvae-tile` defaults: overlap 40 frames / 160 px (5 latents each way). Upstream instead runs
stages 1-3 once on the whole latent and tiles stages 4-5; a latent tile carries its own 5-latent
halo instead, so one worker never needs the whole clip's stage-3 features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ltx_engine.rules.decode_tiling import (
    SPACE_FACTOR,
    TIME_FACTOR,
    DecodeTile,
    split_symmetric,
    split_temporal_causal,
    tile_size_problem,
    tiles_from_axes,
)
from ltx_engine.rules.tiling import Interval

NOISE_SEED_OFFSET = 30000  # a tile's stage-5 noise: seed + 30000 + tile index (the port's rule)


@dataclass(frozen=True)
class DiffusionTileSizes:
    """Diffusion-decode tile sizes in pixels (frames, height, width) and the overlaps (40 frames / 160 px)."""

    frames: int = 96
    height: int = 512
    width: int = 512
    frames_overlap: int = 40
    spatial_overlap: int = 160

    def check(self) -> str | None:
        """One line naming the first bad size, the rule and the smallest sizes, or None."""
        problem = tile_size_problem((self.frames, self.height, self.width),
                                    (self.frames_overlap, self.spatial_overlap, self.spatial_overlap),
                                    (TIME_FACTOR, SPACE_FACTOR, SPACE_FACTOR))
        return f"diffusion decode tiles: {problem}" if problem else None


def min_latent_shape(
    stage_kernels: Sequence[Sequence[int]], strides: Sequence[Sequence[int]], stage5_kernel: Sequence[int]
) -> tuple[int, int, int]:
    """Latent (T, H, W) floor so every stage's attention sees at least its kernel (upstream's rule)."""
    mins = [1, 1, 1]
    cumulative = [1, 1, 1]
    for stage, kernel in enumerate([*stage_kernels[: len(strides)], stage5_kernel]):
        for axis in range(3):
            mins[axis] = max(mins[axis], -(-int(kernel[axis]) // cumulative[axis]))
        if stage < len(strides):
            cumulative = [c * int(s) for c, s in zip(cumulative, strides[stage], strict=True)]
    return mins[0], mins[1], mins[2]


def symmetric_pad(length: int, size: int) -> tuple[int, int]:
    """(before, after) edge pad taking `length` to `size`: leftover at the end."""
    need = max(0, size - length)
    return need // 2, need - need // 2


def stage_frames(
    latent_frames: int, strides: Sequence[Sequence[int]], drop_leading_frame: bool = True
) -> int:
    """Frames after the upsample hops `strides` (a 2x time hop drops its duplicate leading frame)."""
    t = latent_frames
    for stride in strides:
        t = t * int(stride[0]) - (1 if int(stride[0]) == 2 and drop_leading_frame else 0)
    return t


def context_keep(frames: int, ghost_latents: int, time_scale: int, kernel_t: int) -> int:
    """Stage-5 context frames kept after cropping the ghost appendix (never below the stage-5 kernel)."""
    if ghost_latents <= 0:
        return frames
    content = max(frames - ghost_latents * time_scale, 1)
    return min(frames, max(content, kernel_t))


def pixel_frames(latent_frames: int) -> int:
    return 1 + (latent_frames - 1) * TIME_FACTOR


def tile_plan(grid: tuple[int, int, int], sizes: DiffusionTileSizes) -> list[DecodeTile]:
    """Diffusion-decode tiles of a latent grid (f, h, w): the conv decode's split and pixel mapping with
    the diffusion decoder's own sizes and overlaps; numbered frames -> height -> width."""
    f, h, w = grid
    t_size, t_ov = sizes.frames // TIME_FACTOR, sizes.frames_overlap // TIME_FACTOR
    s_ov = sizes.spatial_overlap // SPACE_FACTOR
    t_ivs = [Interval(0, f, 0, 0)] if f <= t_size else split_temporal_causal(t_size, t_ov, f)
    return tiles_from_axes(
        (
            t_ivs,
            split_symmetric(sizes.height // SPACE_FACTOR, s_ov, h),
            split_symmetric(sizes.width // SPACE_FACTOR, s_ov, w),
        )
    )


def parse_sizes(value: object) -> DiffusionTileSizes:
    """ "F,H,W" pixels -> sizes with the 40 / 160 overlaps; ValueError with one line when bad."""
    try:
        f, h, w = (int(x) for x in str(value).replace("x", ",").split(","))
    except ValueError:
        raise ValueError(f"diffusion decode tiles {value!r}: give F,H,W pixels, e.g. 96,512,512") from None
    sizes = DiffusionTileSizes(f, h, w)
    problem = sizes.check()
    if problem:
        raise ValueError(problem)
    return sizes


def tile_noise_seed(seed: int, index: int) -> int:
    return int(seed) + NOISE_SEED_OFFSET + int(index)
