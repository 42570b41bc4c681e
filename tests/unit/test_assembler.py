"""The decode plan (tiles as tasks, auto against the fleet, refusals) and the streaming assembler on real
files: mp4 (H.264 + AAC), EXR frames, the metadata JSON, and bounded memory while blending."""

from __future__ import annotations

import json

import av
import numpy as np
import OpenEXR
import pytest

from coordinator.assemble.assembler import assemble_streaming, srgb_to_linear, tile_frames
from coordinator.assemble.render_meta import stage_timings
from coordinator.plan.decode import decode_tile_plan, plan_decode, resolve_decode_tiles, tile_task_name
from coordinator.plan.fleet import Fleet
from coordinator.plan.render import SpecError, normalize_spec, plan_render, validate_spec

BASE = {"prompt": "a fox", "height": 256, "width": 384, "frames": 97, "frame_rate": 24.0, "pack": "tiny"}
GIB = 2**30


def _spec(**kw) -> dict:
    return normalize_spec({**BASE, **kw})


def _fleet(n: int, memory: int = 64 * GIB) -> Fleet:
    return Fleet.of([{"packs": ["tiny"], "memory_bytes": memory} for _ in range(n)])


def test_tiles_become_tasks_reading_the_whole_latent() -> None:
    spec = _spec(decode_tiles="32,256,384")
    spec = validate_spec(spec, [])
    tasks = plan_decode("r", spec, {"task": "r.stage2", "output": "video_latent"})
    assert [t["id"] for t in tasks] == [f"r.{tile_task_name(i)}" for i in range(10)]
    assert {t["kind"] for t in tasks} == {"decode_tile"} and all(t["deps"] == ["r.stage2"] for t in tasks)
    assert tasks[1]["params"]["latent"] == {"frames": [0, 5], "height": [0, 8], "width": [0, 12]}
    assert tasks[1]["params"]["expect"]["pixels"]["shape"] == [1, 3, 33, 256, 384]
    assert all(t["params"]["product"] == "video_tiles" for t in tasks)
    names = [t["id"].split(".", 1)[1] for t in plan_render(spec, "r")]
    assert "decode" not in names and names[-1] == "audio"


@pytest.mark.parametrize(("value", "why"), [
    ("8,64,64", "frames tile 8 is no larger than its overlap 24"),
    ("32,64,384", "height tile 64 is no larger than its overlap 64"),
    ("32,256,100", "width 100 is not a multiple of 32"),
    ("big", "give auto, off or F,H,W"),
])
def test_bad_decode_tiles_are_one_line_refusals(value: str, why: str) -> None:
    with pytest.raises(SpecError, match=why) as info:
        validate_spec(_spec(decode_tiles=value), _fleet(2))
    assert "\n" not in str(info.value)


def test_auto_tiles_for_a_fleet_or_a_tight_memory_budget() -> None:
    spec = _spec()
    spec = validate_spec(spec, _fleet(1))
    assert spec.decode_tiles == "off"  # one worker with room: one task
    spec = _spec()
    spec = validate_spec(spec, _fleet(2))
    tiles = decode_tile_plan(spec)  # one tile per worker, the whole clip in time (its 24-frame overlap costs more)
    assert spec.decode_tiles == "104,256,224" and len(tiles) == 2 and {t.pixel_shape[0] for t in tiles} == {97}
    reference = decode_tile_plan(spec.resolve(decode_tiles="80,512,768"))  # the reference's sizes: 2 tiles in time
    assert sum(np.prod(t.pixel_shape) for t in tiles) < sum(np.prod(t.pixel_shape) for t in reference)
    small = _spec(frames=25)
    small = validate_spec(small, _fleet(3))
    assert decode_tile_plan(small) is None  # the default tile holds the whole clip: one task
    tight = _spec()
    budget = 97 * 256 * 384 * 3 * 4 * 24 // 2  # half of what the untiled decode needs
    tight = tight.resolve(decode_tiles=resolve_decode_tiles(tight, _fleet(1, budget)))
    tiles = decode_tile_plan(tight)
    assert tiles and max(np.prod(t.pixel_shape) for t in tiles) * 3 * 4 * 24 <= budget
    with pytest.raises(SpecError, match="even at the smallest tiles"):
        resolve_decode_tiles(_spec(), _fleet(1, 1024))


def test_auto_tiles_one_per_mac_on_a_fleet_where_the_reference_would_deal_rounds() -> None:
    """1088x1920x121 on 4 Macs: the reference's sizes give 18 tiles (1.5x the clip's pixels, 4.5 rounds);
    auto gives 2x2 whole-clip tiles, each ending its share in one round (decode.fleet_sizes)."""
    spec = validate_spec(_spec(height=1088, width=1920, frames=121), _fleet(4, 96 * GIB))
    tiles = decode_tile_plan(spec)
    reference = decode_tile_plan(spec.resolve(decode_tiles="80,448,768"))
    assert len(reference) == 18 and len(tiles) == 4 and {t.pixel_shape for t in tiles} == {(121, 576, 992)}
    assert sum(np.prod(t.pixel_shape) for t in tiles) < 1.1 * 121 * 1088 * 1920
    assert decode_tile_plan(validate_spec(_spec(height=1088, width=1920, frames=121), _fleet(1, 96 * GIB))) is None
    one_frame = validate_spec(_spec(height=704, width=1088, frames=1), _fleet(3))  # an axis shorter than a tile
    assert one_frame.decode_tiles == "32,288,1088" and len(decode_tile_plan(one_frame)) == 3
    few = _spec(height=1088, width=1920, frames=121)  # a tile must fit 16 GB: more, smaller tiles
    few = decode_tile_plan(few.resolve(decode_tiles=resolve_decode_tiles(few, _fleet(4, 16 * GIB))))
    assert len(few) > 4 and all(np.prod(t.pixel_shape) * 3 * 4 * 24 <= 16 * GIB for t in few)


def _tile_pixels(tiles, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.0, 1.0, (1, 3, *t.pixel_shape)).astype(np.float32) for t in tiles]


def test_streamed_blend_is_bounded_by_one_window() -> None:
    """Blending + releasing every frame holds one temporal window, whatever the clip's length."""
    import tracemalloc

    peaks = {}
    for frames in (97, 289):
        spec = _spec(frames=frames, decode_tiles="32,256,384")
        tiles = decode_tile_plan(spec)
        pixels = _tile_pixels(tiles)
        tracemalloc.start()
        count = sum(1 for _ in tile_frames(tiles, lambda i, p=pixels: p[i]))
        peaks[frames] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert count == frames
    window = 33 * 256 * 384 * 4 * (3 + 1)  # accumulator + weights of a 33-frame window
    clip_289 = 289 * 256 * 384 * 3 * 4
    print(f"blend peak: 97 frames {peaks[97] / 2**20:.1f} MiB, 289 frames {peaks[289] / 2**20:.1f} MiB; "
          f"window {window / 2**20:.1f} MiB, clip(289) {clip_289 / 2**20:.1f} MiB")
    assert peaks[289] <= window + 8 * 2**20 and abs(peaks[289] - peaks[97]) < 2 * 2**20


def test_assemble_streaming_writes_mp4_exr_and_metadata(tmp_path) -> None:
    spec = _spec(frames=49, decode_tiles="32,256,256", exr="exr")
    tiles = decode_tile_plan(spec)
    pixels = _tile_pixels(tiles, 1)
    rate, seconds = 48000, 49 / 24.0
    wave = np.sin(np.linspace(0, 440 * 2 * np.pi * seconds, int(rate * seconds) + 700)).astype(np.float32)
    outputs = {tile_task_name(i): {"pixels": p} for i, p in enumerate(pixels)}
    outputs["audio"] = {"waveform": np.stack([wave, wave]) * 0.5, "sample_rate": np.array([rate], np.int32)}
    runs = [{"name": "stage1", "kind": "denoise_stage1", "worker": "w1", "start_ms": 1000, "end_ms": 3000,
             "seconds": 1.9}] + [{"name": tile_task_name(i), "kind": "decode_tile", "worker": f"w{i % 2 + 1}",
                                  "start_ms": 3000 + 10 * i, "end_ms": 4000 + 10 * i, "seconds": 0.9}
                                 for i in range(len(tiles))]
    mp4 = assemble_streaming(spec.as_dict(), lambda name, out: outputs.get(name, {}).get(out), tmp_path, runs,
                             exr_dir=tmp_path / "exr")
    expected = [frame for frame in tile_frames(tiles, lambda i: pixels[i])]
    exr_files = sorted((tmp_path / "exr").glob("frame_*.exr"))
    assert [p.name for p in exr_files[:2]] == ["frame_00000.exr", "frame_00001.exr"] and len(exr_files) == 49
    with OpenEXR.File(str(exr_files[7]), separate_channels=True) as exr:
        channels = exr.channels()
        assert sorted(channels) == ["B", "G", "R"] and channels["R"].pixels.dtype == np.float16
        assert channels["R"].pixels.shape == (256, 384)
        linear = srgb_to_linear(expected[7]).astype(np.float16)
        assert np.array_equal(channels["G"].pixels, linear[..., 1])
    with av.open(str(mp4)) as container:
        audio = container.streams.audio[0]
        assert sum(1 for _ in container.decode(video=0)) == 49
        assert audio.codec_context.name == "aac" and audio.rate == rate
        assert abs(float(audio.duration * audio.time_base) - seconds) <= 1.0 / 24
    meta = json.loads((tmp_path / "render.json").read_text())
    assert meta == json.loads((tmp_path / "exr" / "render.json").read_text())
    assert meta["tiling"]["decode_tiles"] == "32,256,256" and meta["tiling"]["decode_tile_count"] == len(tiles)
    assert meta["workers"] == ["w1", "w2"] and meta["timings"]["stages"]["decode"]["tasks"] == len(tiles)
    assert meta["outputs"]["exr_frames"] == 49 and meta["audio"]["samples"] == round(seconds * rate)
    assert 0 < meta["assembly"]["peak_traced_bytes"]


def test_stage_timings_group_tasks_by_stage() -> None:
    runs = [{"name": "stage2.s0.t0", "worker": "a", "start_ms": 100, "end_ms": 600, "seconds": 0.4},
            {"name": "stage2.s0.t1", "worker": "b", "start_ms": 150, "end_ms": 700, "seconds": 0.5},
            {"name": "stage2", "worker": "coordinator", "start_ms": 700, "end_ms": 900, "seconds": 0.1}]
    assert stage_timings(runs) == {"stage2": {"tasks": 3, "compute_s": 1.0, "wall_s": 0.8,
                                              "workers": ["a", "b", "coordinator"]}}
