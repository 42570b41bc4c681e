"""DFR's base path at 0 temporal rounds (`dfr`: padded canvas, keyframe slots in both stages, the trim and
the decode's keyframes) and the spatial epilogue (`spatial_upscalings` 2: the carried planes rebuilt per
task, the detailing pass tiled 2x2 then 4x4 per step) on the tiny LTX-2.5 pack, DFR's epilogue after one
temporal round (two windows, the second pinned on the first) and `a2v --dfr` (a track's window at the
padded canvas frozen through stages 1-2, one video-only round, the source muxed): on one module farm of 2
workers, every task output and the mp4's frames equal `farm render --local` bit for bit; bad DFR specs are
refused at submit in one line with nothing queued."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import av
import numpy as np
import pytest

from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from farm_cli.client import FarmError
from farm_cli.local import render_local
from ltx_engine.rules.audio_source import decode_window
from ltx_engine.tiny.tiny_pack import DETAILING_LORA
from tests.farm.farm_harness import farm, wait_done, wait_until
from tests.media_files import write_wav

BASE = {
    "prompt": "a fox",
    "frames": 41,
    "frame_rate": 24.0,
    "seed": 5,
    "pack": "tiny25",
    "decode_tiles": "off",
    "detailing_lora": DETAILING_LORA,
}
CASES = {
    # 41 -> a 49-frame canvas, slots 24 and 48 (nothing tiled across the width: the plan of 128x192)
    "base_t0": {**BASE, "height": 128, "width": 128, "dfr": True},
    "epilogue": {**BASE, "height": 128, "width": 128, "spatial_upscalings": 2, "audio": False},
}
# the epilogue after one temporal round: 2 windows, the second pinned on the first
ROUNDS = {**CASES["epilogue"], "temporal_upscalings": 1}
# a2v --dfr: the track frozen through the stages, one video-only round; its blob in `track`
A2V = {
    **{k: v for k, v in BASE.items() if k != "detailing_lora"},
    "height": 128,
    "width": 128,
    "temporal_upscalings": 1,
}
A2V_START = 0.25
WORKERS = 2


@pytest.fixture(scope="module")
def track(tmp_path_factory) -> tuple[Path, dict]:
    """A 3 s tone (longer than the canvas's window) and the A2V spec naming it."""
    wav = write_wav(tmp_path_factory.mktemp("dfr25-track") / "tone.wav", seconds=3.0)
    sha = hashlib.sha256(wav.read_bytes()).hexdigest()
    return wav, {**A2V, "audio_input": {"blob": sha, "start": A2V_START, "name": "tone.wav"}}


@pytest.fixture(scope="module")
def references(runner25, track, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    runner, folder, out = runner25, tmp_path_factory.mktemp("dfr25-local"), {}
    wav, a2v = track
    for name, spec in {**CASES, "rounds": ROUNDS, "a2v": a2v}.items():
        media = {a2v["audio_input"]["blob"]: wav} if name == "a2v" else None
        path, outputs, blobs = render_local(dict(spec), folder / f"{name}.mp4", runner, media=media)
        out[name] = (path, {tid.removeprefix("local."): shas for tid, shas in outputs.items()})
        if name == "a2v":  # the muxed window and the encoded latent, as --local stored them
            out["a2v_blobs"] = {k: blobs.get(sha) for k, sha in outputs["local.audio"].items()}
    return out


@pytest.fixture(scope="module")
def dfr_farm(redis_server, packs25, tmp_path_factory):
    """One farm of 2 workers for the module. One count: the tiles and rounds are the same on 2 and 3 workers
    (nothing in these plans depends on the count), and 2 already spread the epilogue's tiles."""
    client = connect(redis_server.url)
    client.flushdb()
    with farm(FarmStore(client), tmp_path_factory.mktemp("dfr25-data"), packs25, workers=WORKERS) as (
        farm_client,
        procs,
    ):
        wait_until(
            lambda: sum(bool((w.get("packs") or {}).get("tiny25")) for w in farm_client.workers()) == WORKERS,
            60,
            "every worker describing tiny25",
        )
        yield farm_client, procs
    client.close()


def _frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


@pytest.mark.timeout(600)
def test_base_path_and_epilogue_on_the_farm_equal_local(dfr_farm, references, track, tmp_path):
    client, _procs = dfr_farm
    wav, a2v = track
    assert client.put_blob(wav.read_bytes()) == a2v["audio_input"]["blob"]
    workers = WORKERS
    for name, spec in {**CASES, "rounds": ROUNDS, "a2v": a2v}.items():
        start = time.monotonic()
        render_id = client.submit(dict(spec))
        render = wait_done(client, render_id, timeout=300)
        local_mp4, local_shas = references[name]
        shas = {t["id"].removeprefix(f"{render_id}."): t.get("outputs") or {} for t in render["tasks"]}
        assert shas == local_shas, (name, workers)  # every task output, planes and tiles included
        frames = _frames(client.fetch_output(render_id, tmp_path / f"{name}-{workers}.mp4"))
        want = (spec["frames"] - 1) * 2 ** spec.get("temporal_upscalings", 0) + 1
        assert len(frames) == want and frames[0].shape == (spec["height"], spec["width"], 3)
        assert all((a == b).all() for a, b in zip(frames, _frames(local_mp4), strict=True))
        ran = {
            t["worker"] for t in render["tasks"] if t.get("worker") and t["kind"] == "transformer_forward"
        }
        print(name, workers, f"{time.monotonic() - start:.1f} s", sorted(ran))
        if name == "rounds":  # window 1's prefix was cut from window 0's output, its tiles spread
            assert {"latent", "prefix", "audio"} <= set(shas["dfr.epi.w1.in"]) and len(ran) == workers
        if name == "a2v":
            _check_a2v(
                render, local_shas, references["a2v_blobs"], wav, local_mp4, tmp_path / "a2v-2.mp4"
            )
        if name == "epilogue":
            assert len(ran) == workers  # the epilogue's tiles spread over every worker
            assert (
                local_shas["dfr.trim"]["keyframes"] == local_shas["dfr.epi.kf0"]["latent"]
            )  # slot 24 kept


def _audio(path: Path) -> tuple[np.ndarray, int]:
    with av.open(str(path)) as container:
        rate = container.streams.audio[0].rate
        return np.concatenate([f.to_ndarray() for f in container.decode(audio=0)], axis=-1), rate


def _check_a2v(render: dict, local: dict, blobs: dict, wav: Path, local_mp4: Path, farm_mp4: Path) -> None:
    """The clip's window encoded once, its latent zero-padded to the canvas and frozen through stages 1-2
    (stage 1's audio out is the encode's latent), no audio decode; the mux is the source window."""
    kinds = [t["kind"] for t in render["tasks"]]
    assert kinds.count("audio_encode") == 1 and "decode_audio" not in kinds
    assert local["stage1"]["audio_latent"] == local["audio"]["latent"]
    params = next(t["params"] for t in render["tasks"] if t["kind"] == "audio_encode")
    assert (params["frames"], params["audio_frames"], params["pad_audio_frames"]) == (41, 43, 51)
    latent = blobs["latent"]
    assert latent.shape[2] == 51 and latent[:, :, :43].any() and not latent[:, :, 43:].any()
    source, rate = decode_window(wav.read_bytes(), A2V_START, 41 / A2V["frame_rate"])
    assert np.array_equal(blobs["waveform"], source)  # the clip's window of the track, at the file's rate
    (farm_audio, farm_rate), (local_audio, local_rate) = _audio(farm_mp4), _audio(local_mp4)
    assert farm_rate == local_rate == rate == 44100 and np.array_equal(farm_audio, local_audio)
    shipped = (A2V["frames"] - 1) * 2 + 1
    assert abs(farm_audio.shape[-1] / rate - shipped / (2 * A2V["frame_rate"])) < 0.05  # the clip's length


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"spatial_upscalings": 3}, "spatial_upscalings 3 is outside 1..2"),
        ({"spatial_upscalings": 2, "height": 192}, "not a multiple of 128"),
        ({"dfr": True, "pack": "tiny"}, "is not an LTX-2.5 pack"),
    ],
)
def test_bad_dfr_specs_are_refused_at_submit(changes, message, dfr_farm):
    client, _procs = dfr_farm
    before = len(client.list())
    with pytest.raises(FarmError, match=message) as info:
        client.submit({**CASES["epilogue"], **changes})
    assert "\n" not in str(info.value)
    assert len(client.list()) == before
