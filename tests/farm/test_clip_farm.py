"""Retake and extend on a real farm: a PyAV-written clip with its own AAC track, 33 frames
at 64x192; one module farm: the retake on 3 workers (its encode tiles dealt over the 3, its one full-size
stage ganged over 2 of them: `--stage1-parallel 2`, the window's masks split with the tokens), then the
extend, the dev retake (guided, each pass a gang of the 2 workers left) and the dev extend (guided, its
passes dealt to the workers) on 2. The plan is the same on any count, so each spec renders once on the farm.
Every task's output is bit for bit `farm render --local`'s, which runs the same split in one process; a
split stage or pass equals the unsplit one bit for bit (tests/unit/test_sequence_parallel.py: the retake's
window masks, the extend's pins, every guided pass), so a ganged render also stands for the plain one. The
retake's latent frames (and audio latents) outside its window are the source's re-encoded ones exactly;
the extend's window holds the pinned context and the joined clip decodes 8 N frames longer."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from farm_cli.local import render_local
from ltx_engine.rules.retake import audio_window_mask, window_latent_frames
from tests.farm.farm_harness import farm, wait_done, wait_until
from tests.media_files import write_clip_with_audio
from tests.session_fixtures import link_packs
from worker.runner import Runner

# 64 pixels high: the same task graph as 128 (the encode's and stage 2's tiles are across the width and in
# time), at half the pixels for the clip's encodes, which are most of this module's compute.
BASE = {
    "prompt": "a fox",
    "height": 64,
    "width": 192,
    "frames": 25,
    "frame_rate": 24.0,
    "seed": 5,
    "pack": "tiny",
}
RETAKE = {"retake": {"start": 0.4, "end": 0.6, "regen_audio": True}, "encode_tiles": "24,128"}
EXTEND = {"extend": {"frames": 1, "direction": "after"}, "stage2_tiles": "1x2", "tile_overlap": 1}
RETAKE_DEV = {**RETAKE, "pack": "dev", "pipeline": "one-stage", "steps": 2, "stg_blocks": [1],
              "negative_prompt": "blurry"}
RETAKE_SP, RETAKE_DEV_SP = ({**spec, "stage1_parallel": "2"} for spec in (RETAKE, RETAKE_DEV))
EXTEND_DEV = {"extend": {"frames": 1, "direction": "after"}, "pack": "dev", "pipeline": "two-stage", "stage1_steps": 2,
              "stage2_steps": 1, "stg_blocks": [1], "negative_prompt": "blurry"}


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = write_clip_with_audio(tmp_path_factory.mktemp("clip") / "clip.mp4", height=BASE["height"])
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return {**BASE, "source_video": {"blob": sha, "name": "clip.mp4"}}, {sha: path}


def _local(clip, extra: dict, local_runner, folder) -> tuple[dict, object]:
    spec, files = clip
    _, outputs, blobs = render_local({**spec, **extra}, folder / "local.mp4", local_runner, [], media=files)
    return {tid.removeprefix("local."): out for tid, out in outputs.items()}, blobs


@pytest.fixture(scope="module")
def clip_packs(tiny_packs, tiny_dev_pack, tmp_path_factory):
    """`tiny` (the distilled retake's and extend's) and `dev` (the dev retake's): links to the session's packs."""
    return link_packs(tmp_path_factory.mktemp("clip-packs"), tiny=tiny_packs / "tiny", dev=tiny_dev_pack)


@pytest.fixture(scope="module")
def module_farm(redis_server, clip_packs, tmp_path_factory):
    client = connect(redis_server.url)
    client.flushdb()
    with farm(FarmStore(client), tmp_path_factory.mktemp("clip-farm"), clip_packs, workers=3) as (
        farm_client,
        procs,
    ):
        yield farm_client, procs
    client.close()


def _render(farm_client, clip, extra: dict) -> dict:
    spec, files = clip
    for sha, path in files.items():
        assert farm_client.put_blob(path.read_bytes()) == sha
    render_id = farm_client.submit({**spec, **extra})
    render = wait_done(farm_client, render_id, timeout=120)
    return {t["id"].removeprefix(f"{render_id}."): t for t in render["tasks"]}


def _same(tasks: dict, local: dict) -> None:
    assert {name: tasks[name].get("outputs") or {} for name in local} == local  # every output, bit for bit
    assert set(tasks) == set(local)


@pytest.fixture(scope="module")
def locals_(clip, local_runner, tmp_path_factory) -> dict:
    """`farm render --local` of the ganged retake and the extend, once for the module."""
    return {
        name: _local(clip, extra, local_runner, tmp_path_factory.mktemp(f"local-{name}"))
        for name, extra in (("retake", RETAKE_SP), ("extend", EXTEND))
    }


def _check_retake(tasks: dict, local: dict, blobs, guided: bool = False) -> None:
    _same(tasks, local)
    kinds = [t["kind"] for t in tasks.values()]
    assert kinds.count("video_encode") == 4  # 2 x 2 tiles
    if guided:  # ONE guided stage: 2 steps x 4 passes, each step's guide step on the coordinator
        assert kinds.count("guidance_pass") == 8 and kinds.count("guide_step") == 2 and "denoise_stage1" not in kinds
    else:
        assert kinds.count("denoise_stage1") == 1  # ONE stage
    assert "denoise_stage2" not in kinds and "upsample_spatial" not in kinds
    source, video = (
        blobs.get(local[n][k]) for n, k in (("source_encode", "latent"), ("stage1", "video_latent"))
    )
    inside = window_latent_frames(25, 24.0, 0.4, 0.6)
    assert inside == [2]
    outside = [k for k in range(source.shape[2]) if k not in inside]
    np.testing.assert_array_equal(video[:, :, outside], source[:, :, outside])
    assert not np.allclose(video[:, :, inside], source[:, :, inside])
    src_audio, audio = (
        blobs.get(local[n][k]) for n, k in (("source_audio", "latent"), ("stage1", "audio_latent"))
    )
    keep = audio_window_mask(src_audio.shape[2], 0.4, 0.6)[0, :, 0] == 0
    np.testing.assert_array_equal(audio[:, :, keep], src_audio[:, :, keep])
    assert not np.allclose(audio[:, :, ~keep], src_audio[:, :, ~keep])


def _check_extend(tasks: dict, local: dict, blobs) -> None:
    _same(tasks, local)
    window, context = blobs.get(local["stage2"]["video_latent"]), blobs.get(local["context_s2"]["latent"])
    np.testing.assert_array_equal(window[:, :, :4], context)  # after: the source's last 4 latent frames
    joined, source = blobs.get(local["join"]["video_latent"]), blobs.get(local["source_encode"]["latent"])
    assert joined.shape[2] == source.shape[2] + 1
    np.testing.assert_array_equal(joined[:, :, :4], source)
    assert blobs.get(local["decode"]["frames"]).shape[0] == 25 + 8


@pytest.mark.timeout(400)
def test_ganged_retake_on_3_workers_matches_local(module_farm, clip, locals_):
    """The retake's encode tiles dealt over 3 workers, its stage 1 (one full-size stage) asked as a gang of 2;
    `--local` runs the same 2-way split in one process: every output bit for bit. The retake's inputs are
    all stage 1's, so the workers are idle when it is ready and it gangs. The extend's pins split the same
    way (held split against unsplit in tests/unit/test_sequence_parallel.py); on a farm its source and
    stage-2 encodes often hold a worker when its stage 1 is ready, and the lease never waits for a busy
    worker, so a farm case would not show a gang."""
    farm_client, _ = module_farm
    wait_until(
        lambda: sum(bool(w.get("packs")) for w in farm_client.workers()) >= 3, 60, "3 workers registered"
    )
    tasks = _render(farm_client, clip, RETAKE_SP)
    _check_retake(tasks, *locals_["retake"])
    stage1 = tasks["stage1"]
    assert stage1["params"]["stage1_degrees"][1] == 2
    assert stage1["metrics"].get("stage1_parallel") == 2, stage1["metrics"].get("gang_broke")
    assert len(set(stage1["ranks"])) == 2


@pytest.mark.timeout(300)
def test_extend_on_2_workers_matches_local(module_farm, clip, locals_):
    farm_client, procs = module_farm
    procs["w3"].terminate()
    procs["w3"].wait(timeout=20)
    tasks = _render(farm_client, clip, EXTEND)
    assert {t.get("worker") for t in tasks.values() if t.get("worker")} <= {"w1", "w2", "coordinator"}
    _check_extend(tasks, *locals_["extend"])


@pytest.mark.timeout(400)
def test_ganged_dev_retake_on_2_workers_matches_local(module_farm, clip, clip_packs, tmp_path_factory):
    """The retake's one full-size stage as the dev recipe's guided stage with `--stage1-parallel 2`: each pass
    a gang task, its forward split over the two workers left (the window's masks with the tokens, the pass's
    perturbation on both ranks), the same tokens outside the window pinned to the source's; `--local` splits
    each pass 2 ways in one process: every output bit for bit, and at least one pass ran as a gang of 2."""
    farm_client, _ = module_farm
    local = _local(clip, RETAKE_DEV_SP, Runner(clip_packs), tmp_path_factory.mktemp("local-retake-dev-sp"))
    tasks = _render(farm_client, clip, RETAKE_DEV_SP)
    passes = [t for t in tasks.values() if t["kind"] == "guidance_pass"]
    assert {t.get("worker") for t in passes} <= {"w1", "w2"}
    _check_retake(tasks, *local, guided=True)
    assert all(t["params"]["stage1_degrees"][1] == 2 for t in passes)
    ganged = [t for t in passes if (t.get("metrics") or {}).get("stage1_parallel") == 2]
    assert ganged and all(len(set(t["ranks"])) == 2 for t in ganged), [(t["id"], t.get("metrics")) for t in passes]


@pytest.mark.timeout(300)
def test_dev_extend_on_2_workers_matches_local(module_farm, clip, clip_packs, tmp_path_factory):
    """The extend's window as the two-stage dev recipe's: a guided stage 1 whose prepare pins the context
    and the boundary audio, stage 2 on dev + the distilled LoRA; the join and decode as the distilled one's."""
    farm_client, _ = module_farm
    local = _local(clip, EXTEND_DEV, Runner(clip_packs), tmp_path_factory.mktemp("local-extend-dev"))
    tasks = _render(farm_client, clip, EXTEND_DEV)
    kinds = [t["kind"] for t in tasks.values()]
    assert kinds.count("guidance_pass") == 8 and kinds.count("guide_step") == 2
    assert tasks["stage2"]["params"]["distilled_lora_strength"] == 1.0
    assert {t.get("worker") for t in tasks.values() if t["kind"] == "guidance_pass"} <= {"w1", "w2"}
    _check_extend(tasks, *local)
