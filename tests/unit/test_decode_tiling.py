"""Decode tiling: plan, masks, streaming blender (and parity with ltx-core's tile plan when installed)."""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest

from ltx_engine.rules.decode_tiling import (
    DecodeTileSizes,
    FrameBlender,
    blend_decoded,
    pixel_frames,
    plan_decode_tiles,
    split_temporal_causal,
    temporal_pixel_span,
    trapezoid,
)
from ltx_engine.rules.tiling import Interval


def _fake_decode(latent: np.ndarray) -> np.ndarray:
    """Causal nearest 'decoder': frame 0 from latent 0, frames 8k-7..8k from latent k; 32x space."""
    b, c, f, h, w = latent.shape
    idx = np.concatenate([[0], np.repeat(np.arange(1, f), 8)]) if f > 1 else np.array([0])
    x = latent[:, :3, idx]
    return np.repeat(np.repeat(x, 32, axis=3), 32, axis=4).astype(np.float32)


def _weights(tiles, shape) -> np.ndarray:
    acc = np.zeros(shape, np.float32)
    for t in tiles:
        acc[t.pixel_slices()] += t.mask()
    return acc


def test_causal_split_example() -> None:
    ivs = split_temporal_causal(24, 8, 56)
    assert ivs == [Interval(0, 24, 0, 8), Interval(15, 40, 9, 8), Interval(31, 56, 9, 0)]


def test_temporal_pixel_mapping() -> None:
    start, stop, mask = temporal_pixel_span(Interval(7, 20, 4, 3))
    assert (start, stop) == (56, 153)
    assert mask[0] == 0.0 and mask.size == 97
    assert np.allclose(mask[:25], np.arange(25) / 25)
    assert np.allclose(mask[-24:], np.arange(24, 0, -1) / 25)


def test_trapezoid_spatial_ramp() -> None:
    m = trapezoid(10, 3, 2, False)
    assert np.allclose(m[:3], [0.25, 0.5, 0.75]) and np.allclose(m[-2:], [2 / 3, 1 / 3])


@pytest.mark.parametrize(
    ("latent", "sizes"),
    [
        ((16, 8, 20), DecodeTileSizes(spatial=384)),
        ((31, 8, 8), DecodeTileSizes(frames=64, frames_overlap=24, spatial=128, spatial_overlap=64)),
        ((9, 30, 17), DecodeTileSizes(frames=32, frames_overlap=8, spatial=320, spatial_overlap=64)),
    ],
)
def test_weights_sum_to_one_everywhere(latent, sizes) -> None:
    tiles = plan_decode_tiles(latent, sizes)
    assert len(tiles) > 1
    shape = (pixel_frames(latent[0]), latent[1] * 32, latent[2] * 32)
    assert np.abs(_weights(tiles, shape) - 1.0).max() <= 1e-6


def test_default_sizes_and_order() -> None:
    tiles = plan_decode_tiles((1, 128, 16, 48, 64), DecodeTileSizes())
    # long side 64 latents -> width tiles of 24, height round(24*48/64) = 18, overlap 2; time 10/3.
    assert tiles[0].latent[0] == Interval(0, 10, 0, 3)
    assert tiles[0].latent[1].end == 18 and tiles[0].latent[2].end == 24
    firsts = [t.latent[0].start for t in tiles]
    assert firsts == sorted(firsts)
    assert tiles[-1].pixel[0][1] == pixel_frames(16)


def test_one_tile_is_identity() -> None:
    rng = np.random.default_rng(0)
    latent = rng.standard_normal((1, 4, 5, 2, 3)).astype(np.float32)
    tiles = plan_decode_tiles(latent.shape, None)
    assert len(tiles) == 1 and np.all(tiles[0].mask() == 1.0)
    frames = list(blend_decoded(tiles, [_fake_decode(latent)]))
    video = np.stack([f for _, f in frames], axis=2)
    np.testing.assert_array_equal(video, _fake_decode(latent))


def test_consistent_tiles_reconstruct_untiled() -> None:
    rng = np.random.default_rng(1)
    latent = rng.standard_normal((1, 3, 17, 6, 9)).astype(np.float32)
    sizes = DecodeTileSizes(frames=48, frames_overlap=16, spatial=128, spatial_overlap=64)
    tiles = plan_decode_tiles(latent.shape, sizes)
    outs = [_fake_decode(latent[(slice(None), slice(None), *t.latent_slices())]) for t in tiles]
    frames = list(blend_decoded(tiles, outs))
    assert [i for i, _ in frames] == list(range(pixel_frames(17)))
    video = np.stack([f for _, f in frames], axis=2)
    np.testing.assert_allclose(video, _fake_decode(latent), rtol=0, atol=1e-5)


def test_blender_out_of_order_and_window() -> None:
    rng = np.random.default_rng(2)
    latent = rng.standard_normal((1, 3, 25, 2, 2)).astype(np.float32)
    sizes = DecodeTileSizes(frames=48, frames_overlap=16, spatial=64, spatial_overlap=32)
    tiles = plan_decode_tiles(latent.shape, sizes)
    outs = [_fake_decode(latent[(slice(None), slice(None), *t.latent_slices())]) for t in tiles]
    expected = list(blend_decoded(tiles, outs))
    blender = FrameBlender(tiles, 1, 3)
    got = []
    order = list(reversed(range(len(tiles))))
    for i in order:
        got.extend(blender.add(i, outs[i]))
    assert blender.done
    assert [i for i, _ in got] == [i for i, _ in expected]
    for (_, a), (_, b) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    # in order: frames stream out before the last tile arrives; the window stays bounded.
    blender = FrameBlender(tiles, 1, 3)
    emitted_before_last = sum(len(blender.add(i, outs[i])) for i in range(len(tiles) - 1))
    assert emitted_before_last > 0
    window = max(t.pixel_shape[0] for t in tiles)
    assert blender._acc.shape[2] <= window


def test_blender_rejects_bad_input() -> None:
    tiles = plan_decode_tiles((3, 2, 2), None)
    blender = FrameBlender(tiles)
    with pytest.raises(ValueError, match="expected"):
        blender.add(0, np.zeros((1, 3, 2, 64, 64), np.float32))
    with pytest.raises(ValueError, match="unexpected"):
        blender.add(5, np.zeros((1, 3, 17, 64, 64), np.float32))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"frames": 24, "frames_overlap": 24},
        {"frames": 16, "frames_overlap": 32},
        {"spatial": 128, "spatial_overlap": 128},
        {"spatial": 100},
        {"frames": 8},
        {"frames_overlap": 12},
    ],
)
def test_validation_errors(kwargs) -> None:
    with pytest.raises(ValueError):
        DecodeTileSizes(**kwargs)


def test_parity_with_reference_tile_plan() -> None:
    torch = pytest.importorskip("torch")
    vv = pytest.importorskip("ltx_core.model.video_vae.video_vae")
    tiling = pytest.importorskip("ltx_core.model.video_vae.tiling")
    from ltx_core.types import SpatioTemporalScaleFactors

    fake = types.SimpleNamespace(video_downscale_factors=SpatioTemporalScaleFactors.default())
    for (f, h, w), (tf, to, sp, so) in itertools.product(
        [(16, 40, 60), (31, 24, 24), (9, 30, 17), (4, 5, 7)], [(80, 24, 768, 64), (32, 8, 320, 64)]
    ):
        cfg = tiling.TilingConfig(
            spatial_config=tiling.SpatialTilingConfig(sp, so),
            temporal_config=tiling.TemporalTilingConfig(tf, to),
        )
        ref = vv.VideoDecoder._prepare_tiles(fake, torch.empty(1, 1, f, h, w), cfg)
        ours = plan_decode_tiles((f, h, w), DecodeTileSizes(tf, to, sp, so))
        assert len(ref) == len(ours)
        for r, o in zip(ref, ours, strict=True):
            assert tuple(r.in_coords[2:]) == o.latent_slices()
            assert tuple(r.out_coords[2:]) == o.pixel_slices()
            for rm, om in zip(r.masks_1d[2:], o.masks_1d, strict=True):
                np.testing.assert_allclose(om, rm.numpy(), rtol=0, atol=1e-6)


def test_parity_with_reference_tiled_decode() -> None:
    torch = pytest.importorskip("torch")
    vv = pytest.importorskip("ltx_core.model.video_vae.video_vae")
    tiling = pytest.importorskip("ltx_core.model.video_vae.tiling")
    from ltx_core.types import SpatioTemporalScaleFactors

    rng = np.random.default_rng(3)
    latent = rng.standard_normal((1, 3, 17, 6, 9)).astype(np.float32)

    def fake_forward(x, *_args):  # tile-dependent output so the blend weights matter
        arr = _fake_decode(x.numpy()) + 0.1 * x.shape[2] + 0.01 * x.shape[3]
        return torch.from_numpy(arr.astype(np.float32))

    dec = vv.VideoDecoder.__new__(vv.VideoDecoder)
    torch.nn.Module.__init__(dec)
    dec.video_downscale_factors = SpatioTemporalScaleFactors.default()
    dec.forward = fake_forward
    cfg = tiling.TilingConfig(
        spatial_config=tiling.SpatialTilingConfig(128, 64),
        temporal_config=tiling.TemporalTilingConfig(48, 16),
    )
    ref = torch.cat(list(dec.tiled_decode(torch.from_numpy(latent), cfg)), dim=2).numpy()
    tiles = plan_decode_tiles(latent.shape, DecodeTileSizes(48, 16, 128, 64))
    outs = [
        fake_forward(torch.from_numpy(latent[(slice(None), slice(None), *t.latent_slices())])).numpy()
        for t in tiles
    ]
    ours = np.stack([f for _, f in blend_decoded(tiles, outs)], axis=2)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)
