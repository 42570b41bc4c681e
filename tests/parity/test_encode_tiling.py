"""Parity of the tiled video VAE encode with ltx-core 1.0.0: the tile plan (pixel slices, latent slices,
masks) against `prepare_tiles_for_encoding`, and the blended latent of the MLX encoder run tile by
tile against the reference `VideoEncoder.tiled_encode` at the tiny config (small: the encoder is
128 channels wide even there)."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ltx_core")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from ltx_core.model.video_vae.tiling import SpatialTilingConfig, TemporalTilingConfig, TilingConfig  # noqa: E402
from ltx_core.model.video_vae.video_vae import prepare_tiles_for_encoding  # noqa: E402

from ltx_engine.encode_tiling import EncodeTileSizes, plan_encode_tiles, tiled_encode  # noqa: E402
from ltx_engine.models.video_vae import tiny_config  # noqa: E402
from tests.parity.test_video_vae import _encoder_pair, _rel  # noqa: E402


def _ref_config(sizes: EncodeTileSizes) -> TilingConfig:
    spatial = None if sizes.spatial is None else SpatialTilingConfig(sizes.spatial, sizes.spatial_overlap)
    temporal = None if sizes.frames is None else TemporalTilingConfig(sizes.frames, sizes.frames_overlap)
    return TilingConfig(spatial_config=spatial, temporal_config=temporal)


def _norm_slice(s: slice, length: int) -> tuple[int, int]:
    start, stop, _ = s.indices(length)
    return start, stop


class _quiet:
    """ltx-core logs a warning where it raises an overlap to its minimum; keep the output quiet."""

    def __enter__(self):
        import logging

        self._logger = logging.getLogger("ltx_core")
        self._level = self._logger.level
        self._logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        self._logger.setLevel(self._level)


PLANS = [
    ((121, 1080, 1920), EncodeTileSizes()),
    ((241, 720, 1280), EncodeTileSizes(frames=48, frames_overlap=8, spatial=256, spatial_overlap=32)),  # raised to minima
    ((97, 512, 768), EncodeTileSizes(frames=None, spatial=320, spatial_overlap=96)),
    ((65, 704, 384), EncodeTileSizes(frames=32, frames_overlap=16, spatial=None)),
    ((33, 64, 64), EncodeTileSizes()),  # smaller than one tile on every axis
    ((30, 96, 160), EncodeTileSizes(frames=24, frames_overlap=16, spatial=96, spatial_overlap=64)),  # cropped to 25
]


@pytest.mark.parametrize("shape,sizes", PLANS)
def test_plan_equals_reference(shape, sizes):
    f, h, w = shape
    f_cropped = f - (f - 1) % 8
    latent = ((f_cropped - 1) // 8 + 1, h // 32, w // 32)
    video = types.SimpleNamespace(shape=torch.Size((1, 3, f_cropped, h, w)))  # the plan reads only the shape
    with _quiet():
        ref = prepare_tiles_for_encoding(video, _ref_config(sizes))
    ours = plan_encode_tiles(f, h, w, sizes)
    assert len(ours) == len(ref)
    for mine, theirs in zip(ours, ref, strict=True):
        for axis, (length, lat) in enumerate(zip((f_cropped, h, w), latent, strict=True)):
            assert _norm_slice(mine.pixels[axis], length) == _norm_slice(theirs.in_coords[2 + axis], length)
            assert _norm_slice(mine.latents[axis], lat) == _norm_slice(theirs.out_coords[2 + axis], lat)
            want = theirs.masks_1d[2 + axis]
            want = np.ones(lat, np.float32) if want is None else want.numpy()
            np.testing.assert_array_equal(mine.masks[axis], want)


def test_tiled_encode_equals_reference():
    ref, ours = _encoder_pair(tiny_config())
    sizes = EncodeTileSizes(frames=24, frames_overlap=16, spatial=96, spatial_overlap=64)
    x = np.tanh(np.random.default_rng(7).standard_normal((1, 3, 25, 32, 128)).astype(np.float32))
    with torch.no_grad(), _quiet():
        want = ref.tiled_encode(torch.from_numpy(x), _ref_config(sizes)).numpy()
    got = tiled_encode(lambda tile: np.array(ours(mx.array(tile))), x, sizes, 128)
    assert got.shape == want.shape == (1, 128, 4, 1, 4)
    assert len(plan_encode_tiles(25, 32, 128, sizes)) == 4  # 2 temporal x 1 x 2 spatial tiles, both overlapping
    assert _rel(got, want) <= 1e-4
