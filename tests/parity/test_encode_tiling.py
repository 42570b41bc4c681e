"""Parity of the tiled video VAE encode with upstream ltx-core 1.2.0 (commit 2362161).

ltx-core 1.0.0 (installed) plans encode tiles the pre-1.2.0 way, so the plan and the blend are held
against 1.2.0's formulas written in `upstream_rules` (`encode_tiles_1_2_0`, `tiled_encode_blend_1_2_0`):
size-based (`TileSizeConfig`) and count-based (`TileCountConfig`) plans — pixel slices and latent
slices equal, masks <= 1e-5 relative — and the blend of the same latents <= 1e-5. The whole encode runs
the MLX encoder tile by tile against 1.0.0's `VideoEncoder.forward` on 1.2.0's tiles and blend, at the
tiny config (<= 1e-4, the encoder's own parity bound); 1.0.0's own `tiled_encode` differs there.
"""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from ltx_core.model.video_vae.tiling import SpatialTilingConfig, TemporalTilingConfig, TilingConfig  # noqa: E402
from ltx_core.model.video_vae.video_vae import prepare_tiles_for_encoding  # noqa: E402

from ltx_engine.models.video_vae import tiny_config  # noqa: E402
from ltx_engine.rules.encode_tiling import (  # noqa: E402
    EncodeTileCounts,
    EncodeTileSizes,
    blend_encoded,
    crop_frames,
    latent_shape,
    plan_encode_tiles,
    tiled_encode,
)
from tests.parity.test_video_vae import _encoder_pair, _rel  # noqa: E402
from tests.parity.upstream_rules import encode_tiles_1_2_0, tiled_encode_blend_1_2_0  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _axes(tiling: EncodeTileSizes | EncodeTileCounts) -> tuple:
    """The same layout as the rule's per-axis specs."""
    if isinstance(tiling, EncodeTileSizes):
        t = None if tiling.frames is None else ("size", tiling.frames, tiling.frames_overlap)
        s = None if tiling.spatial is None else ("size", tiling.spatial, tiling.spatial_overlap)
        return t, s, s
    return (("count", tiling.frames, tiling.frames_overlap), ("count", tiling.height, tiling.height_overlap),
            ("count", tiling.width, tiling.width_overlap))


def _max_rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-12))


def _norm(s: slice, length: int) -> tuple[int, int]:
    return s.indices(length)[:2]


SIZES = [
    ((121, 1080, 1920), EncodeTileSizes()),
    ((241, 720, 1280), EncodeTileSizes(frames=48, frames_overlap=16, spatial=256, spatial_overlap=64)),
    ((97, 512, 768), EncodeTileSizes(frames=None, spatial=320, spatial_overlap=96)),
    ((65, 704, 384), EncodeTileSizes(frames=32, frames_overlap=16, spatial=None)),
    ((33, 64, 64), EncodeTileSizes()),  # smaller than one tile on every axis
    ((30, 96, 160), EncodeTileSizes(frames=24, frames_overlap=16, spatial=96, spatial_overlap=64)),  # cropped to 25
]
COUNTS = [
    ((121, 512, 768), EncodeTileCounts(frames=3, height=2, width=3, frames_overlap=2, height_overlap=1, width_overlap=2)),
    ((97, 704, 1280), EncodeTileCounts(frames=2, width=4, frames_overlap=1, width_overlap=3)),
    ((161, 320, 1280), EncodeTileCounts(frames=4, width=3, frames_overlap=1, width_overlap=2)),  # remainders
    ((25, 96, 160), EncodeTileCounts()),  # one whole tile
]


@pytest.mark.parametrize("shape,tiling", SIZES + COUNTS)
def test_plan_equals_1_2_0(shape, tiling):
    f, h, w = shape
    cropped, grid = crop_frames(f), latent_shape(f, h, w)
    want = encode_tiles_1_2_0(cropped, h, w, _axes(tiling))
    ours = plan_encode_tiles(f, h, w, tiling)
    assert len(ours) == len(want)
    worst = 0.0
    for mine, (pixels, latents, masks) in zip(ours, want, strict=True):
        for axis, (length, lat) in enumerate(zip((cropped, h, w), grid, strict=True)):
            assert _norm(mine.pixels[axis], length) == _norm(pixels[axis], length)
            assert _norm(mine.latents[axis], lat) == _norm(latents[axis], lat)
            worst = max(worst, _max_rel(mine.masks[axis], masks[axis].numpy()))
    print("encode plan masks max rel", worst)
    assert worst <= 1e-5


@pytest.mark.parametrize("shape,tiling", [SIZES[0], SIZES[1], SIZES[5], COUNTS[0], COUNTS[2]])
def test_blend_equals_1_2_0(shape, tiling):
    """The same tile latents blended: the engine's (the coordinator's and --local's) == 1.2.0's."""
    f, h, w = shape
    grid = latent_shape(f, h, w)
    ours = plan_encode_tiles(f, h, w, tiling)
    rng = np.random.default_rng(9)
    latents = [rng.standard_normal((1, 4, *(s.stop - s.start for s in t.latents))).astype(np.float32) for t in ours]
    got = blend_encoded((1, 4, *grid), zip(ours, latents, strict=True))
    want = tiled_encode_blend_1_2_0(encode_tiles_1_2_0(crop_frames(f), h, w, _axes(tiling)),
                                    [torch.from_numpy(x) for x in latents], (1, 4, *grid))
    print("encode blend max rel", _max_rel(got, want.numpy()))
    assert _max_rel(got, want.numpy()) <= 1e-5


def test_overlaps_below_the_encoders_floor_are_refused():
    """1.2.0 refuses them (1.0.0 raised them to 16 frames / 64 px with a warning)."""
    with pytest.raises(ValueError, match="overlap from 16"):
        EncodeTileSizes(frames=48, frames_overlap=8)
    with pytest.raises(ValueError, match="overlap from 64"):
        EncodeTileSizes(spatial=256, spatial_overlap=32)
    with pytest.raises(ValueError, match="exceed"):
        plan_encode_tiles(25, 64, 64, EncodeTileCounts(width=3))


def _forward_1_2_0(ref, x: np.ndarray, tiling) -> np.ndarray:
    f, h, w = x.shape[2:]
    tiles = encode_tiles_1_2_0(f, h, w, _axes(tiling))
    video = torch.from_numpy(x)
    latents = [ref(video[(slice(None), slice(None), *pixels)]) for pixels, _, _ in tiles]
    return tiled_encode_blend_1_2_0(tiles, latents, (1, 128, *latent_shape(f, h, w))).numpy()


@pytest.mark.parametrize("tiling", [EncodeTileSizes(frames=24, frames_overlap=16, spatial=96, spatial_overlap=64),
                                    EncodeTileCounts(frames=2, width=2, frames_overlap=1, width_overlap=1)])
def test_tiled_encode_equals_1_2_0(tiling):
    ref, ours = _encoder_pair(tiny_config())
    x = np.tanh(np.random.default_rng(7).standard_normal((1, 3, 25, 32, 128)).astype(np.float32))
    assert len(plan_encode_tiles(25, 32, 128, tiling)) == 4  # 2 temporal x 1 x 2 spatial tiles, both overlapping
    with torch.no_grad():
        want = _forward_1_2_0(ref, x, tiling)
    got = tiled_encode(lambda tile: np.array(ours(mx.array(tile))), x, tiling, 128)
    assert got.shape == want.shape == (1, 128, 4, 1, 4)
    print("tiled encode rel", _rel(got, want))
    assert _rel(got, want) <= 1e-4
    if isinstance(tiling, EncodeTileSizes):  # 1.0.0's pixel split and 0/1 masks give another latent
        old = TilingConfig(spatial_config=SpatialTilingConfig(96, 64), temporal_config=TemporalTilingConfig(24, 16))
        with torch.no_grad():
            assert prepare_tiles_for_encoding(types.SimpleNamespace(shape=torch.Size(x.shape)), old)
            assert _rel(got, ref.tiled_encode(torch.from_numpy(x), old).numpy()) > 1e-3
