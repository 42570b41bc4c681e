"""Media in on a real farm: an A2V render (a PyAV-written 44.1 kHz tone, with an --image
and a tiled stage 2) that also encodes a source clip tiled across workers, on one module farm of 2
workers: every task's output is bit for bit `farm render --local`'s; the track's latent is
frozen through both stages; the output muxes the source track at its own rate."""

from __future__ import annotations

import hashlib

import av
import numpy as np
import pytest

from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from farm_cli.local import render_local
from protos.tensors import encode_tensor
from tests.farm.farm_harness import farm, wait_done, wait_until
from tests.media_files import write_clip, write_wav

# 64 pixels high: the same task graph as 128 (the encode's and stage 2's tiles are in time and across the
# width) at half the pixels for the clip's encode, most of this module's compute.
SPEC = {
    "prompt": "a fox",
    "height": 64,
    "width": 192,
    "frames": 25,
    "frame_rate": 24.0,
    "seed": 5,
    "pack": "tiny",
    "stage2_tiles": "1x2",
    "tile_overlap": 1,
    "encode_tiles": "24,128",
    "images": [{"frame": 0, "strength": 1.0}],
}
IMAGE = (np.arange(64 * 96 * 3) % 251).astype(np.uint8).reshape(64, 96, 3)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    wav, clip = write_wav(folder / "tone.wav"), write_clip(folder / "clip.mp4")
    spec = {
        **SPEC,
        "audio_input": {"blob": _sha(wav), "start": 0.25, "name": "tone.wav"},
        "source_video": {"blob": _sha(clip), "name": "clip.mp4"},
    }
    return spec, {_sha(wav): wav, _sha(clip): clip}


@pytest.fixture(scope="module")
def reference(media, local_runner, tmp_path_factory):
    spec, files = media
    path, outputs, blobs = render_local(
        spec, tmp_path_factory.mktemp("media-local") / "a2v.mp4", local_runner, [IMAGE], media=files
    )
    return {tid.removeprefix("local."): out for tid, out in outputs.items()}, blobs, path


@pytest.fixture(scope="module")
def module_farm(redis_server, tiny_packs, tmp_path_factory):
    """One farm of 2 workers. One count: the encode tiles and stage 2's tiles are given, so 2 and 3
    workers run the same plan."""
    client = connect(redis_server.url)
    client.flushdb()
    with farm(FarmStore(client), tmp_path_factory.mktemp("media-farm"), tiny_packs, workers=2) as (
        farm_client,
        procs,
    ):
        yield farm_client, procs
    client.close()


def _render(farm_client, media) -> tuple[str, dict]:
    spec, files = media
    for sha, path in files.items():
        assert farm_client.put_blob(path.read_bytes()) == sha
    image = farm_client.put_blob(encode_tensor(IMAGE))
    render_id = farm_client.submit({**spec, "images": [{**SPEC["images"][0], "blob": image}]})
    render = wait_done(farm_client, render_id, timeout=240)
    return render_id, {t["id"].removeprefix(f"{render_id}."): t for t in render["tasks"]}


def _check(tasks: dict, local: dict) -> None:
    assert {name: tasks[name].get("outputs") or {} for name in local} == local  # every output, bit for bit
    kinds = [t["kind"] for t in tasks.values()]
    assert "decode_audio" not in kinds and kinds.count("audio_encode") == 1
    assert (
        kinds.count("video_encode") == 4 and kinds.count("video_encode_blend") == 1
    )  # 2 frame x 2 width tiles
    assert tasks["stage1"]["inputs"]["audio_latent"] == tasks["audio"]["outputs"]["latent"]  # stored resolved
    # the track is frozen through stage 1: its audio latent out is the encoded one
    assert tasks["stage1"]["outputs"]["audio_latent"] == tasks["audio"]["outputs"]["latent"]


def _streams(path) -> tuple[bytes, bytes, int]:
    """An mp4's decoded frames and audio samples (bytes, for one comparison) and its audio rate."""
    with av.open(str(path)) as container:
        frames = b"".join(f.to_ndarray(format="rgb24").tobytes() for f in container.decode(video=0))
    with av.open(str(path)) as container:
        audio = b"".join(f.to_ndarray().tobytes() for f in container.decode(audio=0))
        return frames, audio, container.streams.audio[0].rate


@pytest.mark.timeout(600)
def test_a2v_and_a_tiled_source_encode_match_local_on_the_farm(module_farm, media, reference, tmp_path):
    farm_client, _procs = module_farm
    local, blobs, path = reference
    wait_until(
        lambda: sum(bool(w.get("packs")) for w in farm_client.workers()) >= 2, 60, "2 workers registered"
    )
    render_id, tasks = _render(farm_client, media)
    _check(tasks, local)
    farm_mp4 = farm_client.fetch_output(render_id, tmp_path / "farm.mp4")
    assert _streams(farm_mp4) == _streams(path)  # the mp4's frames and decoded track equal --local's
    assert {t.get("worker") for t in tasks.values() if t.get("worker")} <= {"w1", "w2", "coordinator"}
    with av.open(str(path)) as container:  # the source track, at its own rate (upstream keeps it)
        assert container.streams.audio[0].rate == 44100
    rate = blobs.get(local["audio"]["sample_rate"])
    assert int(rate[0]) == 44100
