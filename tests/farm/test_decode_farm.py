"""Tiled VAE decode across real workers: every tile is a task, the coordinator blends them in tile order
and streams frames to the encoder. Farm (2 workers, one module farm) equals `farm render --local` bit for bit,
tiles decode at the same time on different workers, assembly memory stays at one temporal window, and
the outputs (mp4 with AAC, EXR frames, metadata JSON) are complete."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import OpenEXR
import pytest

from coordinator.plan.decode import decode_tile_plan, tile_task_name
from coordinator.plan.render import normalize_spec, validate_spec
from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from farm_cli.client import FarmError
from farm_cli.local import render_local
from farm_cli.remote import latents_from_outputs
from protos.tensors import decode_tensor
from tests.farm.farm_harness import assert_identical, farm, wait_done

BASE = {"prompt": "a fox", "height": 256, "width": 384, "frame_rate": 24.0, "seed": 7, "pack": "tiny"}
TILED = {**BASE, "frames": 49, "decode_tiles": "32,256,256"}  # 4 temporal x 2 spatial tiles
LONG = {**BASE, "frames": 97, "decode_tiles": "32,256,384"}  # 10 temporal tiles, 33-frame windows


def _tile_count(raw: dict) -> int:
    spec = normalize_spec(dict(raw))
    spec = validate_spec(spec, [])
    return len(decode_tile_plan(spec))


def _arrays(outputs: dict[str, dict[str, str]], rid: str, fetch, tiles: int) -> dict[str, np.ndarray]:
    """Stage latents and every decode tile's raw pixels."""
    arrays = latents_from_outputs(outputs, rid, fetch)
    for i in range(tiles):
        arrays[f"tile{i}"] = fetch(outputs[f"{rid}.{tile_task_name(i)}"]["pixels"])
    return arrays


def _mp4_frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def _exr_frames(folder: Path) -> list[np.ndarray]:
    frames = []
    for path in sorted(folder.glob("frame_*.exr")):
        with OpenEXR.File(str(path), separate_channels=True) as exr:
            frames.append(np.stack([exr.channels()[c].pixels for c in "RGB"], axis=-1))
    return frames


@pytest.fixture(scope="module")
def decode_farm(redis_server, tiny_packs, tmp_path_factory):
    """One farm of 2 workers for the module: (client, store, data folder). One count: the decode tiles are
    given, so 2 and 3 workers run the same plan, and 2 already decode tiles at once on different workers."""
    redis = connect(redis_server.url)
    redis.flushdb()
    store, data = FarmStore(redis), tmp_path_factory.mktemp("decode-data")
    with farm(store, data, tiny_packs, workers=2) as (client, _procs):
        yield client, store, data
    redis.close()


@pytest.fixture(scope="module")
def reference(local_runner, tmp_path_factory):
    folder = tmp_path_factory.mktemp("decode-local")
    spec = {**TILED, "exr": str(folder / "exr")}
    path, outputs, blobs = render_local(spec, folder / "local.mp4", local_runner)
    arrays = _arrays(outputs, "local", blobs.get, _tile_count(TILED))
    return {"arrays": arrays, "mp4": _mp4_frames(path), "exr": _exr_frames(folder / "exr"),
            "meta": json.loads(path.with_suffix(".json").read_text())}


def _overlapping_tiles(events: list[dict]) -> list[tuple[str, str]]:
    """Pairs of decode tiles whose lease → done spans overlap on different workers."""
    spans: dict[str, tuple[int, int, str]] = {}
    leased: dict[str, tuple[int, str]] = {}
    for event in events:
        task = str(event.get("task", ""))
        if ".decode.t" not in task:
            continue
        if event["type"] == "task_leased":
            leased[task] = (int(event["ts"]), event["worker"])
        elif event["type"] == "task_done" and task in leased:
            spans[task] = (leased[task][0], int(event["ts"]), leased[task][1])
    names = sorted(spans)
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
            if spans[a][2] != spans[b][2] and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]]


@pytest.mark.timeout(600)
def test_tiled_decode_matches_local_and_runs_in_parallel(decode_farm, reference, tmp_path):
    client, _store, tmp_data = decode_farm
    workers, tiles = 2, _tile_count(TILED)
    render_id = client.submit({**TILED, "exr": str(tmp_path / "exr")})
    render = wait_done(client, render_id, timeout=400)
    events = list(client.watch(render_id))
    outputs = {t["id"]: t.get("outputs") or {} for t in render["tasks"]}
    arrays = _arrays(outputs, render_id, lambda sha: decode_tensor(client.get_blob(sha)), tiles)
    mp4 = client.fetch_output(render_id, tmp_path / "farm.mp4")
    assert client.fetch_exr(render_id, tmp_path / "exr") == 49  # the client's folder: fetched, not written there
    assert_identical(arrays, reference["arrays"])
    farm_frames = _mp4_frames(mp4)
    assert len(farm_frames) == 49 and all(np.array_equal(a, b) for a, b in zip(farm_frames, reference["mp4"],
                                                                              strict=True))
    exr = _exr_frames(tmp_path / "exr")
    assert len(exr) == 49 and all(np.array_equal(a, b) for a, b in zip(exr, reference["exr"], strict=True))
    decode_tasks = [t for t in render["tasks"] if t["kind"] == "decode_tile"]
    assert len(decode_tasks) == tiles and len({t["worker"] for t in decode_tasks}) >= 2
    overlaps = _overlapping_tiles(events)
    assert overlaps, "no two decode tiles ran at the same time on different workers"
    meta = json.loads((tmp_data / "renders" / render_id / "render.json").read_text())
    assert meta["tiling"]["decode_tile_count"] == tiles == reference["meta"]["tiling"]["decode_tile_count"]
    assert set(meta["workers"]) <= {f"w{i + 1}" for i in range(workers)} | {"coordinator"}


@pytest.mark.timeout(600)
def test_long_tiled_decode_memory_audio_and_exr(decode_farm, tmp_path):
    """97 frames in 33-frame windows: the coordinator's assembly peak stays one window + one tile + a
    constant, well below the clip; the mp4 carries AAC of the clip's length; 97 EXRs; full metadata."""
    client, _store, tmp_data = decode_farm
    render_id = client.submit({**LONG, "exr": str(tmp_path / "exr")})
    wait_done(client, render_id, timeout=400)
    assert client.fetch_exr(render_id, tmp_path / "exr") == 97  # fetched to the client's folder
    out = tmp_data / "renders" / render_id
    meta = json.loads((out / "render.json").read_text())
    assembly = meta["assembly"]
    frame_bytes = 256 * 384 * 3 * 4
    window = assembly["window_bytes"]  # one frame's sums and the tile frames it reads, all counted
    bound = window + 4 * frame_bytes + 16 * 2**20  # + the frame handed to the encoder and EXR, a constant
    print(f"assembly peak {assembly['peak_traced_bytes'] / 2**20:.1f} MiB; window ({assembly['window_frames']} "
          f"frames) {window / 2**20:.1f} MiB; clip {assembly['clip_bytes'] / 2**20:.1f} MiB; "
          f"assemble {assembly['seconds']:.2f} s; stages {json.dumps(meta['timings']['stages'])}")
    assert assembly["window_frames"] == 1 and assembly["clip_bytes"] == 97 * frame_bytes
    assert frame_bytes * 4 // 3 <= window < 4 * frame_bytes
    assert assembly["peak_traced_bytes"] <= bound and assembly["peak_traced_bytes"] < assembly["clip_bytes"]
    stages = meta["timings"]["stages"]
    assert {"text", "stage1", "upsample", "stage2", "decode", "audio"} <= set(stages)
    assert stages["decode"]["tasks"] == 10 and set(stages["decode"]["workers"]) == {"w1", "w2"}
    assert meta["seed"] == 7 and meta["pack"] == "tiny" and meta["tiling"]["decode_tiles"] == "32,256,384"
    exr = sorted((tmp_path / "exr").glob("frame_*.exr"))
    assert len(exr) == 97 and (tmp_path / "exr" / "render.json").is_file()
    with OpenEXR.File(str(exr[-1])) as f:
        (x0, y0), (x1, y1) = f.header()["dataWindow"]
        assert (x1 - x0 + 1, y1 - y0 + 1) == (384, 256)
    with av.open(str(out / "render.mp4")) as container:
        audio = container.streams.audio[0]
        assert audio.codec_context.name == "aac" and audio.channels == 2
        assert abs(float(audio.duration * audio.time_base) - 97 / 24) <= 2 / 24
        assert sum(1 for _ in container.decode(video=0)) == 97


@pytest.mark.timeout(120)
def test_bad_decode_tiles_refused_before_queuing(decode_farm):
    client, store, _data = decode_farm
    before = store.list_renders()
    with pytest.raises(FarmError) as info:
        client.submit({**BASE, "frames": 25, "decode_tiles": "8,64,64"})
    message = str(info.value)
    assert "\n" not in message and "no larger than its overlap" in message
    assert store.list_renders() == before and not any(store.queue_depths().values())  # nothing queued
