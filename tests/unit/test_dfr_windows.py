"""`TilePrefix`: DFR's temporal round tiles and the spatial epilogue's windows, each pinned on the one before.

ltx-core 1.0.0 has neither, so upstream's rules (main's `dfr_helpers.tile_prefix`,
`lead_in_carryover`, `resample_audio_time`, `audio_latent_for_tile` and the window loop of
`dfr_stages._run_epilogue_windows` / `_prepare_epilogue_window_specs`) are written here in numpy and the
farm's `ltx_engine/rules/dfr_windows.py` and `dfr_layout.tile_prefix` / `round_tile_prefix` are held to
them (the round tiles by the same rule, planes = the round's seams and the earlier tiles' new slots, as
upstream's CHANGELOG-era rounds; see docs/parity.md); then the planner's chained graphs."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from coordinator.reduce.reducer import dfr_epi_window, dfr_trim
from ltx_engine.rules import dfr_windows
from ltx_engine.rules.dfr_layout import plan_dfr, plan_params, round_tile_prefix

FLEET = [
    {
        "packs": ["p"],
        "pack_features": {"p": ["keyframes", "temporal_upscaler"]},
        "pack_generation": {"p": "2.5"},
        "memory_bytes": 2**40,
    }
]


def upstream_tile_prefix(seam: int, planes, scale: int = 8) -> tuple[int, int, int, int]:
    """Upstream `tile_prefix`: (keyframe_position, video_start_cell, cells, resume_pixel)."""
    keyframe = max(p for p in planes if p < seam)
    return keyframe, keyframe // scale + 1, 1 + (seam - keyframe) // scale, seam + 1


def upstream_resample(audio: np.ndarray, start: float, end: float, frames: int) -> np.ndarray:
    """Upstream `resample_audio_time`, float32 as its torch.arange."""
    full = audio.shape[2]
    pos = np.clip(
        np.float32(start) + np.float32((end - start) / frames) * np.arange(frames, dtype=np.float32),
        0,
        full - 1,
    )
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, full - 1)
    w = (pos - lo.astype(np.float32)).reshape(1, 1, -1, 1)
    return audio[:, :, lo] * (1 - w) + audio[:, :, hi] * w


def upstream_epilogue(up, guide, planes, positions, intervals, denoise):
    """Upstream's window loop with `denoise(latent, pinned cells, carried)` standing in for the tiled pass."""
    stitched, previous, refs = [], None, []
    for index, (start, end) in enumerate(intervals):
        if index == 0:
            latent, reference, pinned, carried = up[:, :, start:end], guide[:, :, start:end], 0, None
        else:
            key, video_start, cells, _ = upstream_tile_prefix((start - 1) * 8, positions)
            plane = planes[positions.index(key)]
            latent = np.concatenate([plane, up[:, :, video_start:end]], axis=2)
            reference, pinned = guide[:, :, video_start - 1 : end], cells
            base, prev = previous
            offset = video_start - base
            carried = np.concatenate([plane, prev[:, :, offset : offset + cells - 1]], axis=2)
        out = denoise(latent, pinned, carried, index)
        previous = ((video_start - 1) if index else start, out)
        stitched.append(out[:, :, pinned:])
        refs.append(reference)
    return np.concatenate(stitched, axis=2), refs


def _denoise(latent, pinned, carried, index):
    out = np.float32(0.5) * latent + np.float32(index + 1)
    if pinned:
        out[:, :, :pinned] = carried  # strength 1: the pinned cells are the carried ones at every step
    return out


@pytest.mark.timeout(30)
@pytest.mark.parametrize("rounds", [1, 2])
def test_the_windows_cut_pin_and_join_as_upstream(rounds):
    plan = plan_dfr(41, 24.0, rounds, 5)
    windows = dfr_windows.plan_windows(plan)
    last = plan.rounds[-1]
    assert len(windows) == len(last.tiles) == min(2**rounds, len(last.seams))
    positions = list(last.carry())
    rng = np.random.default_rng(0)
    cells = plan.rounds[-1].latent_frames
    up = rng.standard_normal((1, 4, cells, 2, 2)).astype(np.float32)
    guide = rng.standard_normal((1, 4, cells, 1, 1)).astype(np.float32)
    planes = [rng.standard_normal((1, 4, 1, 2, 2)).astype(np.float32) for _ in positions]
    intervals = [(w.start, w.end) for w in windows]
    assert intervals[0][0] == 0 and intervals[-1][1] == cells
    assert all(
        a[1] == b[0] for a, b in zip(intervals, intervals[1:], strict=False)
    )  # the owned cells tile the canvas
    want, refs = upstream_epilogue(up, guide, planes, positions, intervals, _denoise)

    outs = []
    for w in windows:
        plane = planes[positions.index(w.plane)] if w.plane is not None else None
        latent = dfr_windows.window_latent(up, w, plane)
        np.testing.assert_array_equal(dfr_windows.window_reference(guide, w), refs[w.index])
        carried = (
            None if plane is None else dfr_windows.carried_prefix(outs[-1], windows[w.index - 1], w, plane)
        )
        assert latent.shape[2] == w.cells and (w.local_frames - 1) % 8 == 0
        outs.append(_denoise(latent, w.pinned, carried, w.index))
    got = dfr_windows.join_windows(outs, windows)
    assert got.shape[2] == cells
    np.testing.assert_array_equal(got, want)
    for w in windows[1:]:  # the prefix ends on the seam, the window resumes after it
        assert w.origin + (w.pinned - 1) * 8 == w.resume - 1 and w.plane in positions


@pytest.mark.timeout(30)
def test_window_audio_is_upstreams_resample_of_the_playback_time():
    plan = plan_dfr(41, 24.0, 1, 5)
    audio = np.random.default_rng(1).standard_normal((1, 8, 41, 16)).astype(np.float32)
    seconds = plan.canvas.frames / plan.fps
    for w in dfr_windows.plan_windows(plan):
        got = dfr_windows.window_audio(audio, w, plan.output_fps, seconds, 60.0)
        start = w.origin / plan.output_fps / seconds * 41
        end = (w.origin + w.local_frames) / plan.output_fps / seconds * 41
        want = upstream_resample(audio, start, end, round(w.local_frames / 60.0 * 25))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    one = dfr_windows.plan_windows(plan_dfr(41, 24.0, 0, 5))
    assert [(w.start, w.end, w.plane) for w in one] == [(0, 7, None)]  # 0 rounds: the canvas is one window


@pytest.mark.timeout(30)
def test_the_reducer_cuts_each_window_and_the_trim_joins_them():
    plan = plan_dfr(41, 24.0, 1, 5)
    params = {"dfr": plan_params(41, 24.0, 1, 5), "expect": {}}
    rng = np.random.default_rng(2)
    up = rng.standard_normal((1, 4, 13, 2, 2)).astype(np.float32)
    guide = rng.standard_normal((1, 4, 13, 1, 1)).astype(np.float32)
    audio = rng.standard_normal((1, 8, 49, 16)).astype(np.float32)
    plane = rng.standard_normal((1, 4, 1, 2, 2)).astype(np.float32)
    w0 = dfr_epi_window({**params, "window": 0}, {"up": up, "guide": guide, "audio": audio})
    assert set(w0) == {"latent", "reference", "audio"} and w0["latent"].shape[2] == 7
    prev = rng.standard_normal((1, 4, 7, 2, 2)).astype(np.float32)
    w1 = dfr_epi_window(
        {**params, "window": 1}, {"up": up, "guide": guide, "audio": audio, "plane": plane, "previous": prev}
    )
    np.testing.assert_array_equal(w1["prefix"], np.concatenate([plane, prev[:, :, 4:7]], axis=2))
    np.testing.assert_array_equal(w1["latent"][:, :, 1:], up[:, :, 4:13])
    kf = {f"kf{i}": plane for i in range(4)}
    out = dfr_trim(
        {**params, "positions": [24, 48, 72, 96], "windows": 2},
        {"w0": prev, "w1": np.ones((1, 4, 10, 2, 2), np.float32), **kf},
    )
    assert out["video_latent"].shape[2] == plan.output_latent_frames == 11
    np.testing.assert_array_equal(out["video_latent"][:, :, :7], prev)
    assert out["keyframes"].shape[2] == 3  # 24, 48, 72 inside the 81 frames


@pytest.mark.timeout(30)
def test_the_planner_chains_the_windows_after_rounds():
    spec = validate_spec(
        normalize_spec(
            {
                "prompt": "a fox",
                "frames": 41,
                "pack": "p",
                "height": 256,
                "width": 256,
                "spatial_upscalings": 2,
                "temporal_upscalings": 1,
            }
        ),
        FLEET,
    )
    tasks = {t["id"]: t for t in plan_render(spec, "r")}
    assert tasks["r.dfr.r1.t0"]["params"]["expect"]["latent"]["shape"][-2:] == [4, 4]  # rounds at half size
    assert tasks["r.dfr.epi.up"]["inputs"]["latent"] == {"task": "r.dfr.r1", "output": "latent"}
    assert [t["params"]["plane"] for t in tasks.values() if t["kind"] == "dfr_keyframe_plane"] == [
        0,
        1,
        2,
        3,
        0,
    ]
    w1 = tasks["r.dfr.epi.w1.in"]
    assert w1["capability"] == "coordinator"
    assert w1["inputs"]["previous"] == {"task": "r.dfr.epi.w0", "output": "video_latent"}  # chained
    assert w1["inputs"]["plane"] == {"task": "r.dfr.epi.kf0", "output": "latent"}  # the plane at 24
    p0, p1 = tasks["r.dfr.epi.w0.prep"]["params"], tasks["r.dfr.epi.w1.prep"]["params"]
    assert (p0["frames"], p1["frames"], p0["fps"], p1["seed"] - p0["seed"]) == (49, 73, 60.0, 100)
    assert p1["seed"] + p1["ancestral_offset"] == spec.seed + 30000 + 100
    assert [(im["frame"], im["binding"], im["input"]) for im in p1["images"]] == [
        (48, "guide", "kf2_latent"),
        (72, "guide", "kf3_latent"),
        (0, "replace", "prefix_latent"),
    ]
    assert "kf0_latent" not in tasks["r.dfr.epi.w1.prep"]["inputs"]
    forwards = [t for t in tasks.values() if t["kind"] == "transformer_forward"]
    assert (
        sum(t["id"].startswith("r.dfr.epi.w1.") for t in forwards) == 4 + 16 + 16
    )  # parallel tiles per step
    trim = tasks["r.dfr.trim"]
    assert trim["params"]["windows"] == 2 and trim["inputs"]["w1"] == {
        "task": "r.dfr.epi.w1",
        "output": "video_latent",
    }
    assert tasks["r.decode"]["params"]["expect"]["frames"]["shape"][:3] == [81, 256, 256]
    assert tasks["r.dfr.epi.w1.in"]["params"]["cost_s"] > 0


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("frames", "rounds"), [(41, 1), (41, 2), (97, 1), (121, 2)])
def test_round_tiles_start_on_upstreams_tile_prefix_and_pin_the_tile_before(frames, rounds):
    """Each non-first round tile: upstream `tile_prefix` of its seam over the planes known before it (the
    round's seams, the earlier tiles' slots); its prefix is `lead_in_carryover` of the tile before it."""
    rng = np.random.default_rng(3)
    plan = plan_dfr(frames, 24.0, rounds, 5)
    for rnd in plan.rounds:
        carry = rng.standard_normal((1, 2, len(rnd.seams), 1, 1)).astype(np.float32)
        for before, tile in zip(rnd.tiles, rnd.tiles[1:], strict=False):
            known = [*rnd.seams, *(p for t in rnd.tiles[: tile.index] for p in t.slots)]
            key, video_start, cells, resume = upstream_tile_prefix(tile.resume - 1, known)
            assert (tile.pixel_start, tile.latent_start + 1, tile.pinned, tile.resume) == (key, video_start, cells, resume)
            assert key == before.slots[-1] and not set(tile.slots) & set(before.slots)  # each slot made once
            previous = rng.standard_normal((1, 2, before.latent_frames, 1, 1)).astype(np.float32)
            slots = rng.standard_normal((1, 2, len(before.slots), 1, 1)).astype(np.float32)
            offset = video_start - before.latent_start
            want = np.concatenate([slots[:, :, -1:], previous[:, :, offset : offset + cells - 1]], axis=2)
            np.testing.assert_array_equal(round_tile_prefix(rnd, tile, previous, slots, carry), want)
        assert round_tile_prefix(rnd, rnd.tiles[0], None, None, carry) is None
    last = plan.rounds[-1]  # the epilogue's windows start where the last round's tiles do
    windows = dfr_windows.plan_windows(plan)
    assert [(w.plane, w.pinned) for w in windows[1:]] == [(t.pixel_start, t.pinned) for t in last.tiles[1:]]
