"""`--video-decoder diffusion`: LTX-2.5's diffusion decoder as decode tasks. Pure.

The same two task kinds as the conv decode (`decode_video` whole, `decode_tile` per tile, params
`decoder: diffusion`, so they need `vae_decoder_av` instead of the conv VAE), with the diffusion
decoder's own tiles (`ltx_engine.rules.diffusion_tiling`: 40 frames / 160 px overlaps) and a noise seed per
tile (seed + 30000 + index); the assembler blends them exactly as conv tiles. `decode_tiles` auto tiles
when more than one worker holds the pack (the decode is ~15x the conv decode's time: worth spreading).
"""

from __future__ import annotations

from coordinator.plan.costs import DIFF_DECODE_BYTES_PER_VOXEL
from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import SpecError
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.components import DIFFUSION, missing_line
from ltx_engine.rules.decode_tiling import DecodeTile
from ltx_engine.rules.diffusion_tiling import DiffusionTileSizes, parse_sizes, tile_noise_seed, tile_plan
from ltx_engine.rules.generation import LTX_25

COMPONENT = "vae_decoder_av"
DEFAULT = DiffusionTileSizes()


def is_diffusion(spec: RenderPlan) -> bool:
    return spec.video_decoder == DIFFUSION


def check_video_decoder(spec: RenderPlan, has_component: bool | None = None) -> None:
    """Refuse the diffusion decoder on a pack not known to be LTX-2.5, or one without its file
    (`has_component` False: what this machine's pack says; the farm's check reads the workers')."""
    if not is_diffusion(spec):
        return
    if spec.generation != LTX_25:
        raise SpecError(
            f"--video-decoder diffusion needs an LTX-2.5 pack (its vae_decoder_av); pack "
            f"{spec.pack!r} is {spec.generation or 'not described by any worker yet'}"
        )
    if has_component is False:
        raise SpecError(missing_line(COMPONENT, spec.pack))


def sizes_of(spec: RenderPlan) -> DiffusionTileSizes | None:
    """The diffusion tile sizes of the spec's `decode_tiles` (None: off); SpecError for bad sizes."""
    value = spec.decode_tiles.strip().lower()
    if value == "off":
        return None
    if value == "auto":
        return DEFAULT
    try:
        return parse_sizes(value)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def diffusion_tile_plan(spec: RenderPlan, grid: tuple[int, int, int]) -> list[DecodeTile] | None:
    sizes = sizes_of(spec)
    if sizes is None:
        return None
    tiles = tile_plan(grid, sizes)
    return tiles if len(tiles) > 1 else None


def resolve_tiles(spec: RenderPlan, fleet: Fleet) -> str:
    """auto -> the default sizes when more than one worker holds the pack or the whole decode would not
    fit the smallest holder's memory (the seed's ~500 B per output pixel·frame), else off (one task)."""
    value = spec.decode_tiles.strip().lower()
    if value != "auto":
        sizes_of(spec)
        return value
    holders = fleet.holders(spec.pack)
    memories = holders.memories()
    frames = spec.output_frames or spec.frames
    whole = frames * spec.height * spec.width * DIFF_DECODE_BYTES_PER_VOXEL
    if len(holders) <= 1 and (not memories or whole <= min(memories)):
        return "off"
    return f"{DEFAULT.frames},{DEFAULT.height},{DEFAULT.width}"


def decoder_params(spec: RenderPlan, index: int = 0) -> dict:
    """What a diffusion decode task adds to its params: the decoder and its tile's noise seed."""
    if not is_diffusion(spec):
        return {}
    return {"decoder": DIFFUSION, "noise_seed": tile_noise_seed(spec.seed, index)}
