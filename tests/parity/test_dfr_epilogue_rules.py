"""DFR's new pure pieces against upstream's formulas, written here because ltx-core 1.0.0 has no DFR
(they are upstream main's `dfr_helpers/ops.py` `clamp_dim_tiling` and the epilogue grid, `helpers.
decode_keyframes_from_slots`, the DiffVAE's `planes_for_tile` / `keyframe_stage_times`, and Pillow's
8-bit Lanczos resampler that `lanczos_x2_fhwc` calls), and the coordinator's trim task."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coordinator.reduce.reducer import run_reduce_task
from ltx_engine import lanczos
from ltx_engine.rules import dfr_epilogue
from ltx_engine.rules.dfr_layout import plan_params


def _upstream_clamp(dim: int, n: int, overlap: int) -> tuple[int, int]:
    """main's `_clamp_dim_tiling`: overlap <= dim - n, one tile when dim < n."""
    if n <= 1:
        return n, overlap
    if dim < n:
        return 1, 0
    return n, overlap if overlap <= dim - n else dim - n


@pytest.mark.parametrize("dim", [1, 3, 4, 5, 8, 16, 32, 48, 64])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_clamp_matches_upstream(dim, n):
    assert dfr_epilogue.clamp_dim(dim, n, 10) == _upstream_clamp(dim, n, 10)


def test_epilogue_grid_is_coarse_then_fine_as_v1_5():
    """First step 2x2, the rest 4x4, overlap 10 where the tiles hold it; a one-step schedule stays 2x2."""
    tilings = dfr_epilogue.step_tilings((7, 64, 96), 3)
    assert tilings == [((1, 2, 2), (0, 10, 10)), ((1, 4, 4), (0, 10, 10)), ((1, 4, 4), (0, 10, 10))]
    assert dfr_epilogue.step_tilings((7, 64, 96), 1) == [((1, 2, 2), (0, 10, 10))]
    (counts, overlap), *_ = dfr_epilogue.step_tilings((7, 48, 32), 2)[1:]
    assert counts == (1, 4, 4) and overlap == (0, 9, 6)  # the farm's tiles must hold both ramps
    for dim, n, o in ((48, 4, 9), (32, 4, 6), (8, 2, 2)):
        assert (dim + o * (n - 1)) // n >= 2 * o and (dim + (o + 1) * (n - 1)) // n < 2 * (o + 1)
    assert dfr_epilogue.step_tilings((7, 3, 3), 2)[1] == ((1, 1, 1), (0, 0, 0))  # fewer cells than tiles


def test_decode_keyframes_drop_the_padding_as_upstream():
    planes = np.arange(2 * 3 * 4 * 1 * 1, dtype=np.float32).reshape(2, 3, 4, 1, 1)
    kept, frames = dfr_epilogue.decode_keyframes(planes, [24, 48, 72, 96], 81)
    keep = [i for i, p in enumerate([24, 48, 72, 96]) if 0 <= p < 81]  # `decode_keyframes_from_slots`
    np.testing.assert_array_equal(kept, planes[:, :, keep])
    assert frames == (24, 48, 72)
    empty, none = dfr_epilogue.decode_keyframes(planes[:, :, :1], [48], 41)
    assert empty.shape[2] == 0 and none == ()
    with pytest.raises(ValueError):
        dfr_epilogue.decode_keyframes(planes, [24], 81)


def test_planes_for_a_decode_tile_and_their_stage_times():
    positions = [24, 48, 72, 96]
    assert dfr_epilogue.planes_for_tile(positions, 40, 80) == [0, 1, 2, 3]  # inside + one each side
    assert dfr_epilogue.planes_for_tile(positions, 0, 30) == [0, 1]
    assert dfr_epilogue.planes_for_tile(positions, 100, 120) == [3]
    times = dfr_epilogue.keyframe_stage_times([0, 24, 48], stride=8, origin=1.0)
    expected = [0 - 1.0] + [
        (f + (8 - 1) / 2) / 8 - 1.0 for f in (24, 48)
    ]  # t_s(0) = 0, t_s(f) = (f + (r-1)/2)/r
    np.testing.assert_allclose(times, expected, rtol=1e-6)


def _lanczos_reference(x: float) -> float:
    """Pillow's `lanczos_filter`: sinc(x) * sinc(x / 3) inside (-3, 3)."""

    def sinc(v: float) -> float:
        return 1.0 if v == 0 else math.sin(math.pi * v) / (math.pi * v)

    return sinc(x) * sinc(x / 3) if -3 < x < 3 else 0.0


def _float_resample(row: np.ndarray, out: int) -> np.ndarray:
    """Pillow's resample of one row in float64 (support 3, centre (i + 0.5) * in / out, normalised)."""
    n, res = len(row), []
    for i in range(out):
        centre = (i + 0.5) * n / out
        lo, hi = max(int(centre - 3 + 0.5), 0), min(int(centre + 3 + 0.5), n)
        w = np.array([_lanczos_reference(j - centre + 0.5) for j in range(lo, hi)])
        res.append(float((w / w.sum()) @ row[lo:hi]))
    return np.array(res)


def test_lanczos_x2_follows_pillows_8_bit_resampler():
    xs = np.linspace(-3.5, 3.5, 57)
    np.testing.assert_allclose(lanczos.lanczos_weight(xs), [_lanczos_reference(x) for x in xs], atol=1e-12)
    starts, fixed = lanczos.fixed_point_coefficients(6, 12)
    assert np.all(np.abs(fixed.sum(axis=1) - (1 << lanczos.PRECISION_BITS)) <= 4)  # normalised, 22-bit
    frame = ((np.arange(6 * 10 * 3) * 37) % 256).astype(np.uint8).reshape(6, 10, 3)
    out = lanczos.lanczos_x2(frame)
    assert out.shape == (12, 20, 3) and out.dtype == np.uint8
    wide = (
        np.stack(
            [
                np.clip(np.round(_float_resample(frame[r, :, c].astype(float), 20)), 0, 255)
                for r in range(6)
                for c in range(3)
            ]
        )
        .reshape(6, 3, 20)
        .transpose(0, 2, 1)
    )
    tall = (
        np.stack(
            [
                np.clip(np.round(_float_resample(wide[:, x, c], 12)), 0, 255)
                for x in range(20)
                for c in range(3)
            ]
        )
        .reshape(20, 3, 12)
        .transpose(2, 0, 1)
    )
    assert np.abs(out.astype(int) - tall.astype(int)).max() <= 1  # fixed point vs float: one 8-bit level
    flat = np.full((4, 4, 3), 200, np.uint8)
    assert (lanczos.lanczos_x2(flat) == 200).all()
    assert (lanczos.to_uint8(np.array([[[-0.1, 0.5, 1.2]]])) == [[[0, 128, 255]]]).all()


def test_the_coordinators_trim_keeps_the_slots_inside_the_clip():
    rng = np.random.default_rng(0)
    latent = rng.standard_normal((1, 4, 7, 2, 2)).astype(np.float32)  # the 49-frame canvas of 41 frames
    slots = rng.standard_normal((1, 4, 2, 2, 2)).astype(np.float32)
    params = {"dfr": plan_params(41, 24.0, 0, 5), "positions": [24, 48]}
    out = run_reduce_task("dfr_trim", params, {"latent": latent, "keyframes": slots})
    np.testing.assert_array_equal(out["video_latent"], latent[:, :, :6])  # (41 - 1) / 8 + 1 latent frames
    np.testing.assert_array_equal(out["keyframes"], slots[:, :, :1])
    split = run_reduce_task(
        "dfr_trim", params, {"latent": latent, "kf0": slots[:, :, :1], "kf1": slots[:, :, 1:]}
    )
    np.testing.assert_array_equal(split["keyframes"], out["keyframes"])
