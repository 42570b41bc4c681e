"""DFR as upstream runs it (padded canvas, keyframe slots from stage 1 through the rounds, an image
guide per tile, the detailing IC-LoRA in stage 2, stage 2 untiled or tiled) across real workers equals `farm render --local` bit for bit (every task output, the
mp4's frames), ships (frames - 1) * 2**R + 1 frames at frame_rate * 2**R fps, runs the tiles of a round
one after another, each pinned on the one before (upstream's `TilePrefix`; 3 workers, one module farm),
and bad DFR specs (a pack without the temporal upsampler among them) are refused before anything queues."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from farm_cli.client import FarmError
from farm_cli.local import render_local
from ltx_engine.tiny.tiny_pack import DETAILING_LORA
from protos.tensors import encode_tensor
from tests.farm.farm_harness import farm, wait_done, wait_until
from tests.session_fixtures import link_packs, pack_without

# 41 frames pad to a 49-frame canvas (24-frame segments, slots at 24 and 48) and are trimmed back. A round's
# tiles are temporal: 128x128 runs the same rounds and tiles as 128x192; the two cases tiled across the width
# (the decode's 128-pixel tiles, stage 2's 2x2) keep 192.
BASE = {"prompt": "a fox", "height": 128, "width": 128, "frames": 41, "frame_rate": 24.0, "seed": 5,
        "pack": "tiny25", "decode_tiles": "off"}
WIDE = {"width": 192}
UPSAMPLER = "temporal_upscaler_x2_v1_0.safetensors"
IMAGE = (np.arange(96 * 128 * 3) % 251).astype(np.uint8).reshape(96, 128, 3)
CASES = {
    "r1": {**BASE, "temporal_upscalings": 1},
    "r2": {**BASE, "temporal_upscalings": 2, "audio": False},
    "r1_image_tiled_decode": {**BASE, **WIDE, "temporal_upscalings": 1, "decode_tiles": "48,128,128",
                              "image": {"frame": 16, "strength": 0.8}},
    "r2_image": {**BASE, "temporal_upscalings": 2, "audio": False, "image": {"frame": 0, "strength": 1.0}},
    "r1_detailing": {**BASE, "temporal_upscalings": 1, "audio": False, "detailing_lora": DETAILING_LORA},
    "r1_detailing_tiled_stage2": {**BASE, **WIDE, "temporal_upscalings": 1, "audio": False, "detailing_lora": DETAILING_LORA,
                                  "stage2_tiles": "2x2", "tile_overlap": 1},
}


@pytest.fixture(scope="module")
def references(runner25, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """Each case rendered in-process: its mp4 and every task's output shas by task name."""
    runner, folder, out = runner25, tmp_path_factory.mktemp("dfr-local"), {}
    for name, spec in CASES.items():
        path, outputs, _ = render_local(dict(spec), folder / f"{name}.mp4", runner, IMAGE if "image" in spec else None)
        out[name] = (path, {tid.removeprefix("local."): shas for tid, shas in outputs.items()})
    return out


def _mp4(path: Path) -> tuple[list[np.ndarray], float, int]:
    with av.open(str(path)) as container:
        rate = float(container.streams.video[0].average_rate)
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        return frames, rate, len(container.streams.audio)


def _tile_runs(events: list[dict], render_id: str) -> dict[int, dict[int, tuple[float, float, str]]]:
    """Per round, per tile index: (leased ts, done ts, worker) of each DFR tile's successful attempt."""
    leased, runs = {}, {}
    for e in events:
        task = str(e.get("task", ""))
        if ".dfr.r" not in task or ".t" not in task.split(".dfr.")[-1]:
            continue
        if e.get("type") == "task_leased":
            leased[task] = (float(e["ts"]), e["worker"])
        elif e.get("type") == "task_done":
            start, worker = leased[task]
            rnd, tile = task.removeprefix(f"{render_id}.dfr.r").split(".")
            runs.setdefault(int(rnd), {})[int(tile.removeprefix("t"))] = (start, float(e["ts"]), worker)
    return runs


def _timeline(events: list[dict]) -> str:
    """Lease and done events, for a failure message."""
    t0 = min((float(e["ts"]) for e in events if "ts" in e), default=0.0)
    keep = [e for e in events if e.get("type") in ("task_leased", "task_done")]
    return "\n".join(f"{float(e['ts']) - t0:8.0f} {e['type']:12} {e.get('worker')} {e.get('task')}" for e in keep)


def _in_sequence(runs: dict[int, tuple[float, float, str]]) -> bool:
    """Each tile leased only after the tile before it is done (its prefix is that tile's output)."""
    return sorted(runs) == list(range(len(runs))) and all(runs[i][0] >= runs[i - 1][1] for i in range(1, len(runs)))


@pytest.fixture(scope="module")
def dfr_packs(packs25, tiny25_pack, tmp_path_factory) -> Path:
    """tiny25 and tiny, and `noup25`: tiny25 without its temporal upsampler (a pack that cannot run rounds)."""
    folder = link_packs(tmp_path_factory.mktemp("dfr-packs"), tiny25=packs25 / "tiny25", tiny=packs25 / "tiny")
    pack_without(folder / "noup25", tiny25_pack, UPSAMPLER)
    return folder


@pytest.fixture(scope="module")
def dfr_farm(redis_server, dfr_packs, tmp_path_factory):
    """One farm of 3 workers for the module. One count: the plan (rounds, tiles) is the same on 2 and 3
    workers; with 3, a round's chained tiles still land on whichever worker is free."""
    redis = connect(redis_server.url)
    redis.flushdb()
    with farm(FarmStore(redis), tmp_path_factory.mktemp("dfr-data"), dfr_packs, workers=3) as (client, _procs):
        wait_until(lambda: sum(bool((w.get("packs") or {}).get("noup25")) for w in client.workers()) == 3, 60,
                   "3 workers describing their packs")
        yield client
    redis.close()


@pytest.mark.timeout(1500)
def test_dfr_rounds_on_the_farm_equal_local(dfr_farm, references, tmp_path):
    client = dfr_farm
    sha = client.put_blob(encode_tensor(IMAGE))
    for name, spec in CASES.items():  # one at a time, so a round's tiles only compete with each other
        if "image" in spec:
            spec = {**spec, "image": {**spec["image"], "blob": sha}}
        render_id = client.submit(dict(spec))
        render = wait_done(client, render_id, timeout=600)
        events = list(client.watch(render_id))
        mp4 = client.fetch_output(render_id, tmp_path / f"{name}.mp4")
        local_mp4, local_shas = references[name]
        shas = {t["id"].removeprefix(f"{render_id}."): t.get("outputs") or {} for t in render["tasks"]}
        assert shas == local_shas, name  # every task output, tiles and stitches included, bit for bit
        rounds = spec["temporal_upscalings"]
        frames, rate, audio_streams = _mp4(mp4)
        local_frames, local_rate, _ = _mp4(local_mp4)
        assert len(frames) == (spec["frames"] - 1) * 2**rounds + 1 and rate == spec["frame_rate"] * 2**rounds
        assert frames[0].shape == (spec["height"], spec["width"], 3)
        assert audio_streams == (1 if spec.get("audio", True) else 0)
        assert rate == local_rate and all((a == b).all() for a, b in zip(frames, local_frames, strict=True))
        runs = _tile_runs(events, render_id)
        assert sorted(runs) == list(range(1, rounds + 1))
        print(name, {r: [(round(b - a, 2), w) for a, b, w in v.values()] for r, v in runs.items()})
        assert all(_in_sequence(v) for v in runs.values()), _timeline(events)  # TilePrefix chains them


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("changes", "message"), [
    ({"pack": "tiny"}, "is not an LTX-2.5 pack"),
    ({"temporal_upscalings": 3}, "must be 0, 1 or 2"),
    ({"pack": "noup25"}, "has no temporal_upscaler .temporal_upscaler_x2_v1_0.safetensors."),
])
def test_bad_dfr_plans_are_refused_before_queuing(changes, message, dfr_farm):
    client = dfr_farm
    before = [r["id"] for r in client.list()]
    with pytest.raises(FarmError, match=message) as info:
        client.submit({**CASES["r1"], **changes})
    assert "\n" not in str(info.value)
    assert [r["id"] for r in client.list()] == before  # nothing queued
