"""DFR layout: canvas, per-round tile plans, stitch, validation (facts from the reference layout)."""

from __future__ import annotations

import numpy as np
import pytest

from ltx_engine.rules.dfr_layout import (
    ANCESTRAL_ETA,
    ANCHOR_STRENGTH,
    TEMPORAL_SIGMAS,
    choose_segment_length,
    plan_dfr,
    plan_round,
    resolve_canvas,
    stitch_round,
    trim_latent,
)
from ltx_engine.rules.sampling import DISTILLED_SIGMAS


def test_canvas_known_values() -> None:
    c = resolve_canvas(121)
    assert (c.frames, c.segment, c.slots) == (121, 24, (24, 48, 72, 96, 120))
    c = resolve_canvas(97)
    assert (c.frames, c.segment, c.slots) == (97, 32, (32, 64, 96))
    c = resolve_canvas(105)  # 104: pad 16 with 24, 24 with 32
    assert (c.frames, c.segment, c.latent_frames) == (121, 24, 16)
    assert choose_segment_length(96) == 32  # both pad 0: larger wins
    assert choose_segment_length(8) == 24


def test_round_one_plan_97() -> None:
    p = plan_dfr(97, fps=24.0, rounds=1, seed=7)
    (r,) = p.rounds
    assert (r.frames, r.fps, r.seams, r.latent_frames) == (193, 48.0, (64, 128, 192), 25)
    assert r.sigmas == DISTILLED_SIGMAS[4:] == TEMPORAL_SIGMAS
    assert r.eta == ANCESTRAL_ETA == 0.5 and r.anchor_strength == ANCHOR_STRENGTH == 0.95
    t0, t1 = r.tiles
    # 3 segments over 2 tiles: the extra goes to the leading tile
    assert (t0.pixel_start, t0.pixel_end, t0.latent_start, t0.latent_end) == (0, 128, 0, 17)
    assert t0.anchors == (64, 128) and t0.slots == (32, 96) and t0.drop_latent_prefix == 0
    # a non-first tile starts on the last plane before its seam 128 (tile 0's slot 96, TilePrefix) and
    # pins it plus tile 0's cells up to the seam (5 cells, dropped at the stitch: tile 0 keeps the seam)
    assert (t1.pixel_start, t1.pixel_end, t1.latent_start, t1.latent_end) == (96, 192, 12, 25)
    assert t1.anchors == (192,) and t1.slots == (160,) and t1.pinned == t1.drop_latent_prefix == 5
    assert t1.local_anchors == (96,) and t1.local_frames == 97 and t1.resume == 129
    assert (t0.noise_seed, t1.noise_seed) == (1007, 1008)
    assert r.new_slots() == (32, 96, 160)
    assert r.carry() == (32, 64, 96, 128, 160, 192)
    assert (p.output_frames, p.output_fps) == (193, 48.0)


def test_two_rounds_121() -> None:
    p = plan_dfr(121, fps=25.0, rounds=2, seed=0)
    r1, r2 = p.rounds
    assert r1.frames == 241 and len(r1.tiles) == 2
    assert r2.frames == 481 and len(r2.tiles) == 4 and r2.fps == 100.0
    assert r2.conditioning_fps == 60.0
    assert r2.seams == tuple(2 * x for x in r1.carry())
    assert [t.noise_seed for t in r2.tiles] == [2000, 2001, 2002, 2003]
    # 10 segments over 4 tiles: 3, 3, 2, 2 owned; each non-first tile starts half a segment before its seam
    owned = [(t.pixel_end - max(t.resume - 1, 0)) // 48 for t in r2.tiles]
    assert owned == [3, 3, 2, 2] and [t.pixel_start for t in r2.tiles] == [0, 120, 264, 360]
    assert [len(t.slots) for t in r2.tiles] == owned  # each slot made once, by its owner
    assert (p.output_frames, p.output_fps) == (481, 100.0)


def test_stitch_round_reassembles_the_round_latent() -> None:
    p = plan_dfr(97, fps=24.0, rounds=2, seed=3)
    for r in p.rounds:
        full = np.arange(r.latent_frames, dtype=np.float32)[None, None, :, None, None] * np.ones(
            (1, 2, 1, 2, 2)
        )
        tiles = [full[:, :, t.latent_start : t.latent_end].astype(np.float32) for t in r.tiles]
        np.testing.assert_array_equal(stitch_round(tiles, r), full)
        # the earlier tile keeps the seam latent
        marked = [x.copy() for x in tiles]
        for i, x in enumerate(marked):
            x += 1000 * i
        out = stitch_round(marked, r)
        seam = r.tiles[1].latent_start + r.tiles[1].drop_latent_prefix - 1
        assert out[0, 0, seam, 0, 0] == seam  # from tile 0
        assert out[0, 0, seam + 1, 0, 0] == seam + 1 + 1000


def test_trim_to_requested() -> None:
    p = plan_dfr(105, fps=24.0, rounds=1, seed=0)  # canvas 121 -> 241 frames, output 209
    assert p.final_frames == 241 and p.output_frames == 209 and p.output_latent_frames == 27
    lat = np.zeros((1, 2, 31, 1, 1), np.float32)
    assert trim_latent(lat, p).shape[2] == 27
    p0 = plan_dfr(105, fps=24.0, rounds=0, seed=0)
    assert p0.rounds == () and p0.output_frames == 105 and p0.final_frames == 121


def test_single_segment_clamps_tiles() -> None:
    p = plan_dfr(25, fps=24.0, rounds=1, seed=0)
    assert len(p.rounds[0].tiles) == 1 and p.rounds[0].tiles[0].anchors == (48,)


@pytest.mark.parametrize(
    ("frames", "rounds", "match"),
    [(1, 1, ">= 2"), (100, 1, "% 8"), (97, 3, "rounds"), (0, 0, ">= 2")],
)
def test_plan_validation(frames, rounds, match) -> None:
    with pytest.raises(ValueError, match=match):
        plan_dfr(frames, fps=24.0, rounds=rounds, seed=0)


def test_round_validation() -> None:
    with pytest.raises(ValueError, match="terminal"):
        plan_round(1, [64, 128], 193, 48.0, 0)
    with pytest.raises(ValueError, match="increasing"):
        plan_round(1, [128, 64, 192], 193, 48.0, 0)
    with pytest.raises(ValueError, match="multiple"):
        plan_round(1, [60, 192], 193, 48.0, 0)
    with pytest.raises(ValueError, match="2 latent"):
        plan_round(1, [8, 192], 193, 48.0, 0)
    with pytest.raises(ValueError, match="round"):
        plan_round(0, [64, 128, 192], 193, 48.0, 0)
    with pytest.raises(ValueError, match="fps"):
        plan_dfr(97, fps=0, rounds=1, seed=0)


def test_stitch_validation() -> None:
    r = plan_dfr(97, fps=24.0, rounds=1, seed=0).rounds[0]
    good = [np.zeros((1, 1, t.latent_frames, 1, 1), np.float32) for t in r.tiles]
    with pytest.raises(ValueError, match="expected 2"):
        stitch_round(good[:1], r)
    with pytest.raises(ValueError, match="latent T"):
        stitch_round([good[0], good[0][:, :, :3]], r)
    with pytest.raises(ValueError, match="B, C, T, H, W"):
        stitch_round([good[0][0], good[1]], r)
