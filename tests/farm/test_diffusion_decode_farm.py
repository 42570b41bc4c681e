"""`--video-decoder diffusion` on the farm: LTX-2.5's diffusion decoder in three decode tiles.

The tiny 2.5 pack's `vae_decoder_av` decodes a 64x256x9 render in three latent tiles (48,192,192 px:
the 160 px overlap leaves a 1-latent stride), each a `decode_tile` task with its own noise seed on any
worker; the farm's every task output is the same blob, bit for bit, as `farm render --local`'s on the
module's one farm of 3 workers (the decode tiles are given, so the plan is the same on any count; the
local reference decodes every tile in one process, the farm each tile wherever it is dealt). Refusals through the real CLI: a
2.3 pack, a 2.5 pack without the file (naming it and the `hf download` that gets it), a bad decoder
name, each one line, exit 2, nothing queued. And the keyframe-aware decode: a DFR base-path render
(41 frames, the trimmed clip keeps slot 24) decoded in three tiles, each task given the plane the plan
names, equal to `--local`. And the keyframe-aware decode without DFR: a plain distilled
render with two `--image` keyframes past frame 0 (17 frames, images at 8 and 16) decoded in three tiles,
each given both image planes, equal to `--local`. And the generated keyframes
outside DFR: a distilled render with `--num-generated-keyframes 1` (17 frames, the slot at 8) whose stage 2
carries the upsampled slot and whose three decode tiles each read stage 2's slot as their plane, equal to
`--local` (every output and the frames).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from farm_cli.local import render_local
from ltx_engine.tiny.tiny_pack import DETAILING_LORA
from protos.tensors import encode_tensor
from tests.farm.farm_harness import ROOT, farm, join_token, wait_done, wait_until
from tests.session_fixtures import link_packs, pack_without

ARGS = [
    "-p",
    "a fox",
    "-H",
    "64",
    "-W",
    "256",
    "-f",
    "9",
    "--seed",
    "5",
    "--decode-tiles",
    "48,192,192",
    "--video-decoder",
    "diffusion",
]
SPEC = {
    "prompt": "a fox",
    "height": 64,
    "width": 256,
    "frames": 9,
    "seed": 5,
    "pack": "tiny25",
    "decode_tiles": "48,192,192",
    "video_decoder": "diffusion",
}
DFR_SPEC = {
    "prompt": "a fox",
    "height": 128,
    "width": 256,
    "frames": 41,
    "seed": 5,
    "pack": "tiny25",
    "dfr": True,
    "detailing_lora": DETAILING_LORA,
    "decode_tiles": "48,192,192",
    "video_decoder": "diffusion",
    "audio": False,
}
KEYED_SPEC = {**SPEC, "frames": 17, "audio": False}
GENERATED_SPEC = {**KEYED_SPEC, "num_generated_keyframes": 1}
KEYED_IMAGES = [{"frame": 8, "strength": 0.9}, {"frame": "last", "strength": 1.0}]
PICTURES = [(np.arange(96 * 128 * 3) % 251).astype(np.uint8).reshape(96, 128, 3)]
PICTURES.append(np.ascontiguousarray(PICTURES[0][::-1, ::-1]))
WORKERS = 3


@pytest.fixture(scope="module")
def packs(tmp_path_factory, tiny25_pack, tiny_packs):
    """tiny25 (with vae_decoder_av), tiny25-conv (the same pack without it) and the 2.3 tiny pack: links
    to the session's packs."""
    folder = tmp_path_factory.mktemp("diffdec-packs")
    pack_without(folder / "tiny25-conv", tiny25_pack, "vae_decoder_av.safetensors")
    return link_packs(folder, tiny25=tiny25_pack, tiny=tiny_packs / "tiny")


def _local(spec: dict, runner25, folder, pictures: tuple = ()) -> tuple[dict, object]:
    """Task name -> output shas of `farm render --local` (the reference; the session's warm tiny25
    runner, the same pack as the farm's), and its mp4."""
    path, outputs, _ = render_local(dict(spec), folder / "local.mp4", runner25, list(pictures))
    return {name.removeprefix("local."): shas for name, shas in outputs.items()}, path


@pytest.fixture(scope="module")
def local_shas(runner25, tmp_path_factory):
    """Task name -> output shas of `farm render --local` (the reference)."""
    return _local(SPEC, runner25, tmp_path_factory.mktemp("diffdec-local"))[0]


@pytest.fixture(scope="module")
def dfr_local_shas(runner25, tmp_path_factory):
    """The DFR render's task outputs under `farm render --local`."""
    return _local(DFR_SPEC, runner25, tmp_path_factory.mktemp("diffdec-dfr-local"))[0]


@pytest.fixture(scope="module")
def keyed_local_shas(runner25, tmp_path_factory):
    """The keyframed (no DFR) render's task outputs under `farm render --local`."""
    spec = {**KEYED_SPEC, "images": KEYED_IMAGES}
    shas, path = _local(spec, runner25, tmp_path_factory.mktemp("diffdec-keyed-local"), tuple(PICTURES))
    return shas, _mp4_frames(path)


@pytest.fixture(scope="module")
def generated_local_shas(runner25, tmp_path_factory):
    """The generated-keyframes (no DFR) render's task outputs and frames under `farm render --local`."""
    shas, path = _local(GENERATED_SPEC, runner25, tmp_path_factory.mktemp("diffdec-generated-local"))
    return shas, _mp4_frames(path)


def _mp4_frames(path) -> list[np.ndarray]:
    import av

    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def _same_as_local(client, render_id: str, tasks: dict, local: tuple, tmp_path) -> None:
    """The same tasks as `--local`'s (none missing or extra), each output bit for bit, and its 17 frames."""
    local_shas, local_frames = local
    assert tasks.keys() == local_shas.keys()
    for name, shas in local_shas.items():
        assert (tasks[name].get("outputs") or {}) == shas, f"{name} differs from --local"
    frames = _mp4_frames(client.fetch_output(render_id, tmp_path / "farm.mp4"))
    assert len(frames) == len(local_frames) == 17
    assert all(np.array_equal(a, b) for a, b in zip(frames, local_frames, strict=True))


@pytest.fixture(scope="module")
def diff_farm(redis_server, tmp_path_factory, packs):
    redis = connect(redis_server.url)
    redis.flushdb()
    data = tmp_path_factory.mktemp("diffdec-farm")
    (data / "client").mkdir()
    (data / "client" / "packs").symlink_to(packs)  # `farm render --local` reads FARM_DATA/packs
    with farm(FarmStore(redis), data, packs, workers=WORKERS) as (client, _procs):
        from coordinator.api.auth import load_or_create_token

        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(data),
            "FARM_DATA": str(data / "client"),
            "PYTHONPATH": str(ROOT),
            "FARM_TOKEN": join_token(data, load_or_create_token(data)),
        }
        wait_until(
            lambda: sum(len(w.get("packs") or {}) >= 3 for w in client.workers()) >= WORKERS,
            60,
            "the workers to describe their packs",
        )
        yield client, env
    redis.close()


def _cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from farm_cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
        env=env,
    )


@pytest.mark.timeout(600)
def test_tiled_diffusion_decode_matches_local(diff_farm, local_shas):
    client, env = diff_farm
    done = _cli(env, "submit", *ARGS, "--pack", "tiny25", "--coordinator", client.address)
    assert done.returncode == 0, done.stderr[-3000:]
    render = wait_done(client, done.stdout.strip().splitlines()[-1], timeout=500)
    tasks = {t["id"].removeprefix(render["id"] + "."): t for t in render["tasks"]}
    tiles = [tasks[f"decode.t{i}"] for i in range(3)]
    assert "decode.t3" not in tasks and "decode" not in tasks
    assert [t["params"]["noise_seed"] for t in tiles] == [30005, 30006, 30007]
    assert all(
        t["params"]["decoder"] == "diffusion" and t["params"]["needs"] == ["vae_decoder_av"] for t in tiles
    )
    assert tasks.keys() == local_shas.keys()  # the same tasks, none missing or extra on the farm
    for name, shas in local_shas.items():
        assert (tasks[name].get("outputs") or {}) == shas, f"{name} differs from --local"


@pytest.mark.timeout(400)
def test_keyframe_aware_dfr_decode_matches_local(diff_farm, dfr_local_shas):
    """Each decode tile gets the trimmed clip's keyframes input and the plane (global frame 24) it
    attends to; every task output equals `--local`'s."""
    client, _env = diff_farm
    render = wait_done(client, client.submit(dict(DFR_SPEC)), timeout=380)
    tasks = {t["id"].removeprefix(render["id"] + "."): t for t in render["tasks"]}
    tiles = [tasks[f"decode.t{i}"] for i in range(3)]
    assert "decode.t3" not in tasks
    for tile in tiles:
        assert tile["params"]["keyframe_frames"] == [24] and tile["params"]["keyframe_planes"] == [0]
    assert tasks.keys() == dfr_local_shas.keys()  # the same tasks, none missing or extra on the farm
    for name, shas in dfr_local_shas.items():
        assert (tasks[name].get("outputs") or {}) == shas, f"{name} differs from --local"


@pytest.mark.timeout(400)
def test_keyframe_aware_decode_of_a_keyframed_render_matches_local(diff_farm, keyed_local_shas, tmp_path):
    """No DFR: each decode tile gets the two image planes (frames 8 and 16, their full-size encodes);
    every task output and the frames equal `--local`'s."""
    client, _env = diff_farm
    local_shas, local_frames = keyed_local_shas
    blobs = [client.put_blob(encode_tensor(picture)) for picture in PICTURES]
    images = [{**im, "blob": b} for im, b in zip(KEYED_IMAGES, blobs, strict=True)]
    render = wait_done(client, client.submit({**KEYED_SPEC, "images": images}), timeout=380)
    tasks = {t["id"].removeprefix(render["id"] + "."): t for t in render["tasks"]}
    tiles = [tasks[f"decode.t{i}"] for i in range(3)]
    for tile in tiles:
        assert (tile["params"]["keyframe_frames"], tile["params"]["keyframe_planes"]) == ([8, 16], [0, 1])
        assert tile["inputs"]["keyframe1"] == tasks["image2_s2"]["outputs"]["latent"]  # the full-size encode
    _same_as_local(client, render["id"], tasks, (local_shas, local_frames), tmp_path)


@pytest.mark.timeout(400)
def test_generated_keyframes_carried_into_stage2_and_decoded_match_local(diff_farm, generated_local_shas, tmp_path):
    """Stage 1's slot (frame 8), upsampled, is stage 2's slot; each decode tile reads stage 2's slot as its
    plane; every task output and the frames equal `--local`'s."""
    client, _env = diff_farm
    local_shas, local_frames = generated_local_shas
    render = wait_done(client, client.submit(dict(GENERATED_SPEC)), timeout=380)
    tasks = {t["id"].removeprefix(render["id"] + "."): t for t in render["tasks"]}
    assert tasks["stage2"]["params"]["generated_slots"] == [8]
    assert tasks["stage2"]["inputs"]["slots"] == tasks["upsample.slots"]["outputs"]["latent"]
    for tile in [tasks[f"decode.t{i}"] for i in range(3)]:
        assert (tile["params"]["keyframe_frames"], tile["params"]["keyframe_planes"]) == ([8], [0])
        assert tile["inputs"]["keyframes"] == tasks["stage2"]["outputs"]["slots"]
    _same_as_local(client, render["id"], tasks, (local_shas, local_frames), tmp_path)


@pytest.mark.timeout(300)
def test_refusals_are_one_line_exit_2_nothing_queued(diff_farm):
    client, env = diff_farm
    queued = [r["id"] for r in client.list()]
    cases = [
        (("render", "--local", *ARGS, "--pack", "tiny"), "needs an LTX-2.5 pack"),
        (
            ("render", "--local", *ARGS, "--pack", "tiny25-conv"),
            "hf download dgrauet/ltx-2.5-mlx-q8 vae_decoder_av",
        ),
        (("submit", *ARGS, "--pack", "tiny", "--coordinator", client.address), "needs an LTX-2.5 pack"),
        (
            ("submit", *ARGS, "--pack", "tiny25-conv", "--coordinator", client.address),
            "vae_decoder_av.safetensors",
        ),
        (
            ("submit", *ARGS[:-1], "bogus", "--pack", "tiny25", "--coordinator", client.address),
            "give conv or diffusion",
        ),
    ]
    for args, says in cases:
        done = _cli(env, *args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and says in lines[0], (args, done.stderr[-2000:])
    assert [r["id"] for r in client.list()] == queued  # nothing queued
