"""A chunked distilled render on a real farm: 3 windows of 17 frames carrying 9 (stage 2 in 1x2 tiles,
each window decoded in 2 tiles) with the decoded carry (blended from the decode tiles on the coordinator) and
with the latent carry, 3 windows with a long A2V track (each window frozen to its own slice), and 2 windows
with two `--segment`s (each window its own text task), each on 3 workers; the guided two-stage recipe
chunked on 2 (the third drained). One worker count per case: a chunked render's plan is the same on any
number of workers (its tiles are given), so a second count would only deal the same tasks again.
Every task's output is bit for bit `farm render --local`'s, and so are the joined clip's frames in render.mp4.
Each spec's `--local` reference is rendered once for the module; the farm starts with 3 workers and its
third is drained for the last (2-worker) test."""

from __future__ import annotations

import hashlib
import json

import av
import numpy as np
import pytest

from farm_cli.local import render_local
from ltx_engine.rules.prompt_relay import RELAY
from protos.tensors import encode_tensor
from tests.farm.farm_harness import ModuleFarm, farm, wait_done, wait_until
from tests.media_files import write_wav
from tests.session_fixtures import link_packs

SPEC = {"prompt": "a fox", "height": 64, "width": 128, "frames": 33, "seed": 5, "pack": "tiny", "chunked": True,
        "chunk_pixel_frames": 17, "chunk_carry_frames": 9, "stage2_tiles": "1x2", "tile_overlap": 1,
        "decode_tiles": "32,96,96"}


def _frames(path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


_LOCAL: dict[str, tuple] = {}  # spec (JSON) -> render_local's (mp4, outputs): one reference per spec


def _fleet(chunk_farm, workers: int) -> None:
    """Exactly w1..w`workers` serving: the missing ones started, the ones above drained and gone."""
    chunk_farm.workers(workers)
    for name in sorted(set(chunk_farm.procs) - {f"w{i + 1}" for i in range(workers)}):
        assert chunk_farm.client.drain(name)
        chunk_farm.procs.pop(name).wait(timeout=60)


def _farm_equals_local(chunk_farm, spec: dict, local_runner, folder, workers: int,
                       media: dict | None = None, images: tuple = ()) -> tuple[dict, np.ndarray, object]:
    """Render `spec` on the module farm's `workers` and with `--local`: every task output and the mp4's
    frames bit for bit equal, only those workers (and the coordinator) ran tasks; (the farm's tasks by
    name, the frames, the farm's mp4)."""
    client = chunk_farm.client
    _fleet(chunk_farm, workers)
    wait_until(lambda: sum(bool(w.get("packs")) for w in client.workers()) >= workers, 60,
               f"{workers} workers registered")
    uploaded = [client.put_blob(encode_tensor(px)) for px in images]  # `images`: the spec's keyframes' pixels
    farm_spec = {**spec, "images": [{**im, "blob": b} for im, b in zip(spec["images"], uploaded, strict=True)]} \
        if images else dict(spec)
    render_id = client.submit(farm_spec)
    render = wait_done(client, render_id, timeout=240)
    tasks = {t["id"].removeprefix(f"{render_id}."): t for t in render["tasks"]}
    key = json.dumps(spec, sort_keys=True)
    if key not in _LOCAL:
        out, outputs, _ = render_local(dict(spec), folder / "local.mp4", local_runner, list(images), media=media)
        _LOCAL[key] = out, outputs
    out, outputs = _LOCAL[key]
    local = {tid.removeprefix("local."): out for tid, out in outputs.items()}
    assert set(tasks) == set(local)
    assert {name: tasks[name].get("outputs") or {} for name in local} == local  # every output, bit for bit
    assert {t.get("worker") for t in tasks.values()} <= {*(f"w{i + 1}" for i in range(workers)), "coordinator"}
    mp4 = chunk_farm.data / "renders" / render_id / "render.mp4"
    frames = _frames(mp4)
    np.testing.assert_array_equal(frames, _frames(out))
    return tasks, frames, mp4


@pytest.fixture(scope="module")
def chunk_packs(tiny_packs, tiny_dev_pack, tmp_path_factory):
    """`tiny` (the distilled recipe's) and `dev` (the guided recipes'): links to the session's packs."""
    return link_packs(tmp_path_factory.mktemp("chunk-packs"), tiny=tiny_packs / "tiny", dev=tiny_dev_pack)


@pytest.fixture(scope="module")
def chunk_farm(mstore, chunk_packs, tmp_path_factory):
    data = tmp_path_factory.mktemp("chunk-farm")
    with farm(mstore, data, chunk_packs, workers=3) as (client, procs):
        yield ModuleFarm(client, procs, data, chunk_packs)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("carry", ["decoded", "latent"])
def test_three_windows_match_local(carry, chunk_farm, local_runner, tmp_path):
    tasks, frames, _ = _farm_equals_local(chunk_farm, {**SPEC, "chunk_carry": carry}, local_runner, tmp_path, 3)
    carried = "chunk_carry" if carry == "decoded" else "chunk_latent_carry"
    assert sum(t["kind"] == carried for t in tasks.values()) == (2 if carry == "decoded" else 4)
    assert frames.shape[0] == 33


@pytest.mark.timeout(300)
def test_two_windows_with_two_segments_match_local(chunk_farm, local_runner, tmp_path):
    """Windows [0, 17) and [8, 25) frames: "sleeps" [0, 0.5) s and "runs" [0.5, 1.04) s each straddle the
    seam, so each window relays both, clipped to it, from a text task of its own."""
    spec = {**SPEC, "frames": 25, "segments": [{"text": "the fox sleeps", "seconds": 0.5},
                                               {"text": "the fox runs", "seconds": 0.54}]}
    tasks, frames, _ = _farm_equals_local(chunk_farm, spec, local_runner, tmp_path, 3)
    assert sorted(n for n, t in tasks.items() if t["kind"] == "text_encode") == ["w0.text", "w1.text"]
    assert all(RELAY in tasks[f"w{k}.text"]["outputs"] for k in (0, 1))
    assert frames.shape[0] == 25


def _audio(path) -> tuple[np.ndarray, int]:
    with av.open(str(path)) as container:
        frames = [f.to_ndarray() for f in container.decode(audio=0)]
        return np.concatenate(frames, axis=-1), container.streams.audio[0].rate


@pytest.mark.timeout(300)
def test_three_windows_with_a_long_track_match_local(chunk_farm, local_runner, tmp_path):
    """A2V chunked: a 3 s tone from 0.25 s; each window encodes and freezes its own slice of it, the output
    muxes the track's window of the whole clip: as long as the 33 frames and sounding throughout."""
    wav = write_wav(tmp_path / "tone.wav", seconds=3.0)
    sha = hashlib.sha256(wav.read_bytes()).hexdigest()
    assert chunk_farm.client.put_blob(wav.read_bytes()) == sha
    spec = {**SPEC, "audio_input": {"blob": sha, "start": 0.25, "name": "tone.wav"}}
    tasks, frames, mp4 = _farm_equals_local(chunk_farm, spec, local_runner, tmp_path, 3, media={sha: wav})
    assert sorted(n for n, t in tasks.items() if t["kind"] == "audio_encode") == ["audio", "w0.audio", "w1.audio",
                                                                                  "w2.audio"]
    assert frames.shape[0] == 33
    wave, rate = _audio(mp4)
    assert abs(wave.shape[-1] / rate - 33 / 24) < 2048 / rate  # the clip's length (AAC's priming aside)
    steps = wave[0, : wave.shape[-1] // (rate // 24) * (rate // 24)].reshape(-1, rate // 24)
    assert (np.sqrt((steps**2).mean(axis=1)) > 0.05).all()  # the tone runs through every frame's time


GUIDED = {**SPEC, "frames": 25, "seed": 3, "pack": "dev", "pipeline": "two-stage", "stage1_steps": 2,
          "stage2_steps": 1, "stg_blocks": [1], "negative_prompt": "blurry",
          "images": [{"frame": 20, "strength": 0.8, "binding": "guide"}]}
KEYFRAME = (np.arange(64 * 128 * 3) % 251).astype(np.uint8).reshape(64, 128, 3)


@pytest.mark.timeout(300)
def test_two_guided_windows_with_a_keyframe_on_two_workers_match_local(chunk_farm, chunk_packs, tmp_path):
    """The guided two-stage recipe chunked: windows [0, 17) and [8, 25), each a guided stage 1 (passes on
    the workers, steps on the coordinator) and a tiled dev stage 2, window 1 pinned on window 0's carry; a
    keyframe at frame 20 guides window 1 at its frame 12. `--local` runs the same plan on the dev pack."""
    from worker.runner import Runner

    tasks, frames, _ = _farm_equals_local(chunk_farm, GUIDED, Runner(chunk_packs), tmp_path, 2, images=(KEYFRAME,))
    assert sorted(n for n, t in tasks.items() if t["kind"] == "text_encode") == ["negative", "text"]
    assert tasks["w1.stage1.prep"]["params"]["images"][1] == {"frame": 12, "strength": 0.8, "binding": "guide",
                                                              "input": "image1_latent"}
    assert all(not im["input"].startswith("image") for im in tasks["w0.stage1.prep"]["params"]["images"])
    assert sum(t["kind"] == "guidance_pass" for t in tasks.values()) == 2 * 2 * 4  # windows x steps x passes
    assert frames.shape[0] == 25
