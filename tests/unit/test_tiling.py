"""Tiled data parallel: splits, masks, token sets, cut/blend/reduce."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ltx_engine.rules.tiling import (
    DimensionTilingConfig as D,
)
from ltx_engine.rules.tiling import (
    Interval,
    TileCountConfig,
    average_audio,
    balanced_tile_split,
    blend_tile_output,
    cut_tile_inputs,
    masked_tile_output,
    plan_tiles,
    ramp_mask_1d,
    reduce_masked_outputs,
    reduce_tiles,
    split_by_count,
    split_by_size,
    tile_token_set,
    tile_token_sets,
)


def _bounds(ivs: list[Interval]) -> list[tuple[int, int]]:
    return [(iv.start, iv.end) for iv in ivs]


def _video_positions(grid: tuple[int, int, int], batch: int = 1, fps: float = 24.0) -> np.ndarray:
    """(B, 3, F*H*W, 2) pixel/seconds intervals like the reference patchifier (causal first frame)."""
    f, h, w = grid
    ff, hh, ww = np.meshgrid(np.arange(f), np.arange(h), np.arange(w), indexing="ij")
    t0 = np.maximum(ff * 8 - 7, 0) / fps
    t1 = (ff * 8 + 1) / fps
    pos = np.stack(
        [np.stack([t0, t1], -1), np.stack([hh * 32, hh * 32 + 32], -1), np.stack([ww * 32, ww * 32 + 32], -1)]
    ).reshape(3, -1, 2)
    return np.broadcast_to(pos[None], (batch, 3, f * h * w, 2)).astype(np.float32).copy()


def test_split_by_count_known_values() -> None:
    assert _bounds(split_by_count(2, 5)(32)) == [(0, 19), (14, 32)]
    assert _bounds(split_by_count(4, 5)(48)) == [(0, 16), (11, 27), (22, 38), (33, 48)]
    ivs = split_by_count(4, 5)(48)
    assert [(iv.left_ramp, iv.right_ramp) for iv in ivs] == [(0, 5), (5, 5), (5, 5), (5, 0)]


def test_split_by_size() -> None:
    ivs = split_by_size(10, 3)(24)
    assert _bounds(ivs) == [(0, 10), (7, 17), (14, 24)]
    assert split_by_size(10, 3)(10) == [Interval(0, 10, 0, 0)]


@pytest.mark.parametrize(
    ("n", "expected"),
    [(1, (1, 1)), (2, (1, 2)), (4, (2, 2)), (8, (2, 4)), (16, (4, 4)), (6, (2, 3)), (7, (1, 7))],
)
def test_balanced_tile_split(n: int, expected: tuple[int, int]) -> None:
    assert balanced_tile_split(n) == expected


def test_split_errors() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        split_by_count(5, 0)(4)
    with pytest.raises(ValueError, match="overlap"):
        split_by_count(2, 5)(5)  # size 5 <= overlap 5
    with pytest.raises(ValueError, match="overlap"):
        split_by_size(5, 5)
    with pytest.raises(ValueError):
        split_by_count(4, 5)(17)  # tiles shorter than their two ramps
    with pytest.raises(ValueError):
        D(num_tiles=0)


def test_ramp() -> None:
    np.testing.assert_allclose(ramp_mask_1d(8, 3, 2), [0.25, 0.5, 0.75, 1, 1, 1, 2 / 3, 1 / 3], atol=1e-7)
    assert ramp_mask_1d(4, 0, 0).dtype == np.float32


LAYOUTS = [
    ((4, 32, 48), TileCountConfig.balanced(2)),
    ((4, 32, 48), TileCountConfig.balanced(4)),
    ((4, 32, 48), TileCountConfig.balanced(8)),
    ((4, 32, 48), TileCountConfig.balanced(16)),
    ((8, 20, 30), TileCountConfig(D(2, 2), D(2, 3), D(2, 4))),
    ((13, 17, 23), TileCountConfig(D(3, 1), D(3, 2), D(2, 0))),
    ((5, 11, 7), TileCountConfig(D(1, 0), D(1, 5), D(1, 0))),
]


@pytest.mark.parametrize(("grid", "counts"), LAYOUTS)
def test_masks_sum_to_one(grid, counts) -> None:
    tiles = plan_tiles(grid, counts)
    assert len(tiles) == counts.num_tiles
    acc = np.zeros(grid, np.float32)
    for t in tiles:
        m = t.mask()
        assert m.shape == t.shape and m.dtype == np.float32
        acc[t.slices()] += m
    assert np.abs(acc - 1).max() <= 1e-6


def test_tile_order_frames_height_width() -> None:
    tiles = plan_tiles((8, 20, 30), TileCountConfig(D(2, 2), D(2, 3), D(2, 4)))
    keys = [(t.frames.start, t.height.start, t.width.start) for t in tiles]
    assert keys == sorted(keys) and [t.index for t in tiles] == list(range(8))
    assert tiles[1].width.start > 0 and tiles[1].height.start == 0


def test_generated_indices_and_normalised_positions() -> None:
    grid = (3, 12, 16)
    pos = _video_positions(grid, batch=2)
    tiles = plan_tiles(grid, TileCountConfig.balanced(4, overlap=2))
    sets = tile_token_sets(tiles, pos, pos[:, :, :0], grid)
    for tt in sets:
        t = tt.tile
        f, h, w = np.meshgrid(*(np.arange(iv.start, iv.end) for iv in t.intervals), indexing="ij")
        np.testing.assert_array_equal(tt.gen_indices, (f * 12 * 16 + h * 16 + w).reshape(-1))
        x = np.zeros((2, pos.shape[2], 4), np.float32)
        inp = cut_tile_inputs(x, np.ones((2, pos.shape[2], 1), np.float32), pos, tt)
        starts = inp.positions[..., 0].min(axis=2)
        np.testing.assert_array_equal(starts, np.zeros((2, 3), np.float32))
        widths = inp.positions[..., 1] - inp.positions[..., 0]
        np.testing.assert_allclose(widths, (pos[..., 1] - pos[..., 0])[:, :, tt.keep_indices], atol=1e-6)


def _cond_positions(grid, fps=24.0) -> np.ndarray:
    """A reference token at negative time, a keyframe over the top-left, one over the full frame."""
    _, h, w = grid
    ref = [[-1.0, -0.5], [0, 32], [0, 32]]
    kf_top_left = [[8 / fps, 9 / fps], [0, 64], [0, 64]]
    kf_bottom_right = [[16 / fps, 17 / fps], [(h - 1) * 32, h * 32], [(w - 1) * 32, w * 32]]
    arr = np.array([ref, kf_top_left, kf_bottom_right], np.float32).transpose(
        1, 0, 2
    )  # (3 axes, 3 tokens, 2)
    return arr[None]


def test_conditioning_keep_and_weights() -> None:
    grid = (3, 16, 24)
    pos = _video_positions(grid)
    cond = _cond_positions(grid)
    tiles = plan_tiles(grid, TileCountConfig.balanced(4, overlap=2))
    sets = tile_token_sets(tiles, pos, cond, grid)
    n_gen = int(np.prod(grid))
    ref_idx = n_gen
    for tt in sets:
        assert ref_idx in tt.cond_indices  # negative time: kept by every tile
        k = list(tt.cond_indices).index(ref_idx)
        assert tt.cond_weights[k] == np.float32(1 / len(tiles))
    assert [n_gen + 1 in tt.cond_indices for tt in sets] == [True, False, False, False]
    assert [n_gen + 2 in tt.cond_indices for tt in sets] == [False, False, False, True]
    assert sets[0].cond_weights[list(sets[0].cond_indices).index(n_gen + 1)] == 1.0
    # the single-tile helper agrees with the batch one
    one = tile_token_set(tiles[2], pos, cond, grid, tiles)
    np.testing.assert_array_equal(one.keep_indices, sets[2].keep_indices)
    # conditioning positions shift with the tile's offset, widths unchanged
    x = np.zeros((1, n_gen + 3, 2), np.float32)
    inp = cut_tile_inputs(
        x, np.zeros((1, n_gen + 3), np.float32), np.concatenate([pos, cond], axis=2), sets[3]
    )
    np.testing.assert_allclose(inp.positions[:, :, -1], cond[:, :, 2] - sets[3].offset[:, :, 0], atol=1e-6)


def test_single_tile_no_overlap_is_identity() -> None:
    grid = (3, 8, 10)
    rng = np.random.default_rng(0)
    pos = _video_positions(grid)
    cond = _cond_positions(grid)
    full_pos = np.concatenate([pos, cond], axis=2)
    n = full_pos.shape[2]
    latent = rng.standard_normal((1, n, 6)).astype(np.float32)
    ts = rng.random((1, n, 1)).astype(np.float32)
    tiles = plan_tiles(grid, TileCountConfig())
    (tt,) = tile_token_sets(tiles, pos, cond, grid)
    inp = cut_tile_inputs(latent, ts, full_pos, tt, normalize_positions=False)
    np.testing.assert_array_equal(inp.latent, latent)
    np.testing.assert_array_equal(inp.timesteps, ts)
    np.testing.assert_array_equal(inp.positions, full_pos)
    out = rng.standard_normal((1, n, 6)).astype(np.float32)
    buf = blend_tile_output(np.zeros_like(out), tt, out)
    np.testing.assert_array_equal(buf, out)
    np.testing.assert_array_equal(reduce_tiles([buf]), out)
    # normalisation is a no-op when positions already start at 0
    np.testing.assert_array_equal(cut_tile_inputs(latent, ts, full_pos, tt).positions, full_pos)


def test_tiled_identity_model_reconstructs_input() -> None:
    """An elementwise 'model' gives back its input exactly where masks sum to 1 (all tokens)."""
    grid = (4, 16, 24)
    rng = np.random.default_rng(1)
    pos = _video_positions(grid)
    cond = _cond_positions(grid)
    full_pos = np.concatenate([pos, cond], axis=2)
    n = full_pos.shape[2]
    x = rng.standard_normal((1, n, 5)).astype(np.float32)
    tiles = plan_tiles(grid, TileCountConfig(D(2, 1), D(2, 3), D(2, 3)))
    sets = tile_token_sets(tiles, pos, cond, grid)
    buffers, masked = [], []
    for tt in sets:
        inp = cut_tile_inputs(x, np.zeros((1, n), np.float32), full_pos, tt)
        buffers.append(blend_tile_output(np.zeros_like(x), tt, inp.latent))
        masked.append(masked_tile_output(tt, inp.latent))
    full = reduce_tiles(buffers)
    np.testing.assert_allclose(full, x, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(reduce_masked_outputs(x.shape, sets, masked), full)


def test_reduce_is_order_fixed_and_audio_average() -> None:
    rng = np.random.default_rng(2)
    outs = [rng.standard_normal((1, 7, 3)).astype(np.float32) for _ in range(5)]
    expected = outs[0] + outs[1] + outs[2] + outs[3] + outs[4]
    np.testing.assert_array_equal(reduce_tiles(outs), expected)
    np.testing.assert_array_equal(average_audio(outs), expected / np.float32(5))
    with pytest.raises(ValueError):
        reduce_tiles([])


def test_masked_output_shape_check() -> None:
    grid = (1, 4, 4)
    pos = _video_positions(grid)
    (tt,) = tile_token_sets(plan_tiles(grid, TileCountConfig()), pos, pos[:, :, :0], grid)
    with pytest.raises(ValueError, match="tokens"):
        masked_tile_output(tt, np.zeros((1, 3, 2), np.float32))


def test_split_by_size_and_ramp_match_reference() -> None:
    """ltx-core 1.0's VAE splitter and trapezoid are the same split_by_size / ramp as upstream TDP."""
    vv = pytest.importorskip("ltx_core.model.video_vae.video_vae")
    ref_tiling = pytest.importorskip("ltx_core.model.video_vae.tiling")
    for size, ov, length in itertools.product([6, 10, 16], [0, 2, 5], [5, 16, 33, 48]):
        if size < 2 * ov:
            continue  # we reject layouts whose ramps overlap inside a tile; the reference allows them
        ref = vv.split_with_symmetric_overlaps(size, ov)(length)
        ours = split_by_size(size, ov)(length)
        assert list(zip(ref.starts, ref.ends, ref.left_ramps, ref.right_ramps, strict=True)) == [
            (i.start, i.end, i.left_ramp, i.right_ramp) for i in ours
        ]
    for length, left, right in [(19, 0, 5), (16, 5, 5), (15, 5, 0), (7, 3, 3), (1, 0, 0)]:
        expected = ref_tiling.compute_trapezoidal_mask_1d(length, left, right).numpy()
        np.testing.assert_allclose(ramp_mask_1d(length, left, right), expected, rtol=0, atol=1e-7)
