"""The HDR IC-LoRA render on a real farm (`--hdr-ic-lora CLIP` on the tiny 2.5 pack): a 25-frame
128x64 SDR clip (PyAV-written) uploaded once, encoded as working codes in 4 tiles across workers, the seam
frame as a guide, one stage with the pack's HDR LoRA, the tiled conv decode; on one module farm of 2
workers every task output (latents included), the mp4's frames and the HLG master's planes (PyAV)
and the EXR frames (OpenEXR) equal `farm render --local`'s bit for bit. Bad HDR renders are refused at
submit through the real CLI: one line, exit 2, nothing queued. And the grade decoded by the keyframe-aware
diffusion decoder (`--video-decoder diffusion`, the clip read at 256 px wide): three decode tiles, each
reading the stage's seam slot (frame 24), every output and frame equal to `--local`'s on the same farm. And the
grade under `--stage1-parallel 2`: its stage ganged over both workers, equal to `--local`'s 2-way split."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import OpenEXR
import pytest

from coordinator.assemble.hdr_master import HLG_FILE, hlg_path
from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from farm_cli.local import render_local
from ltx_engine.rules.hdr_lora import HDR_LORA_FILE
from tests.farm.farm_harness import ROOT, farm, wait_done, wait_until
from tests.media_files import write_clip
from tests.session_fixtures import link_packs, pack_without

WORKERS = 2
CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]
HEIGHT, WIDTH, FRAMES = 64, 128, 25
SPEC = {
    "prompt": "a harbour at dawn",
    "height": HEIGHT,
    "width": WIDTH,
    "frames": FRAMES,
    "seed": 7,
    "pack": "tiny25",
    "audio": False,
    "hdr": True,
    "encode_tiles": "24,96",
    "decode_tiles": "auto",
}


@pytest.fixture(scope="module")
def packs(packs25, tiny25_pack, tmp_path_factory) -> Path:
    """tiny25 (with its HDR LoRA), tiny (LTX-2.3) and nolora25: tiny25's files without the LoRA."""
    folder = link_packs(tmp_path_factory.mktemp("hdr-packs"), tiny25=packs25 / "tiny25", tiny=packs25 / "tiny")
    pack_without(folder / "nolora25", tiny25_pack, HDR_LORA_FILE)
    return folder


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> tuple[Path, dict]:
    path = write_clip(
        tmp_path_factory.mktemp("hdr-clip") / "clip.mp4", frames=FRAMES, width=WIDTH, height=HEIGHT
    )
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return path, {**SPEC, "hdr_ic_lora": {"blob": sha, "name": "clip.mp4"}}


@pytest.fixture(scope="module")
def reference(runner25, clip, tmp_path_factory):
    """`--local` in this (main) thread, before any farm starts."""
    path, spec = clip
    folder = tmp_path_factory.mktemp("hdr-local")
    mp4, outputs, _ = render_local(
        {**spec, "exr": str(folder / "exr")},
        folder / "local.mp4",
        runner25,
        media={spec["hdr_ic_lora"]["blob"]: path},
    )
    return mp4, folder / "exr", {tid.removeprefix("local."): out for tid, out in outputs.items()}


DIFFUSION = {"width": 256, "encode_tiles": "off", "video_decoder": "diffusion", "decode_tiles": "48,192,192"}


def _local_variant(runner25, clip, tmp_path_factory, extra: dict, name: str) -> tuple:
    """`--local` of the grade with `extra` over the module's spec: its mp4 and task outputs."""
    path, spec = clip
    folder = tmp_path_factory.mktemp(name)
    mp4, outputs, _ = render_local(
        {**spec, **extra}, folder / "local.mp4", runner25, media={spec["hdr_ic_lora"]["blob"]: path}
    )
    return mp4, {tid.removeprefix("local."): out for tid, out in outputs.items()}


@pytest.fixture(scope="module")
def diffusion_reference(runner25, clip, tmp_path_factory):
    """`--local` of the grade under the diffusion decoder: its frames and task outputs."""
    return _local_variant(runner25, clip, tmp_path_factory, DIFFUSION, "hdr-diff-local")


GANGED = {"stage1_parallel": "2", "decode_tiles": "off"}


@pytest.fixture(scope="module")
def ganged_reference(runner25, clip, tmp_path_factory):
    """`--local` of the grade under `--stage1-parallel 2`: its stage split 2 ways in the process."""
    return _local_variant(runner25, clip, tmp_path_factory, GANGED, "hdr-sp-local")


@pytest.fixture(scope="module")
def hdr_farm(reference, diffusion_reference, ganged_reference, redis_server, packs, tmp_path_factory):
    """One farm of 2 workers for the module. One count: the encode and decode tiles are the same on 2 and 3
    workers (the plan does not depend on the count), and 2 already spread the encode tiles."""
    client = connect(redis_server.url)
    client.flushdb()
    data = tmp_path_factory.mktemp("hdr-data")
    with farm(FarmStore(client), data, packs, workers=WORKERS) as (farm_client, procs):
        wait_until(
            lambda: sum(bool((w.get("packs") or {}).get("tiny25")) for w in farm_client.workers()) == WORKERS,
            60,
            "every worker describing tiny25",
        )
        yield farm_client, procs, data
    client.close()


def _frames(path: Path, fmt: str | None = "rgb24") -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format=fmt) if fmt else f.to_ndarray() for f in container.decode(video=0)]


def _exr(folder: Path) -> list[np.ndarray]:
    out = []
    for path in sorted(folder.glob("frame_*.exr")):
        with OpenEXR.File(str(path), separate_channels=True) as exr:
            out.append(np.stack([exr.channels()[c].pixels for c in "RGB"], axis=-1))
    return out


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) > 0 and all(
        x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b, strict=True)
    )


@pytest.mark.timeout(600)
def test_hdr_ic_lora_on_the_farm_equals_local(hdr_farm, reference, clip, tmp_path):
    farm_client, _procs, _ = hdr_farm
    local_mp4, local_exr, local = reference
    path, spec = clip
    kinds = [k.split(".")[0] for k in local]
    assert kinds.count("source_hdr") == 5 and "source_guide0" in local and "slots" in local["stage1"]
    exr = _exr(local_exr)
    assert (
        len(exr) == FRAMES
        and exr[0].dtype == np.float16
        and all(np.isfinite(f).all() and f.min() >= 0 for f in exr)
    )
    workers = WORKERS
    start = time.monotonic()
    assert farm_client.put_blob(path.read_bytes()) == spec["hdr_ic_lora"]["blob"]
    render_id = farm_client.submit({**spec, "exr": str(tmp_path / "asked-exr")})
    render = wait_done(farm_client, render_id, timeout=240)
    print(workers, "workers", f"{time.monotonic() - start:.1f} s")
    tasks = {t["id"].removeprefix(f"{render_id}."): t for t in render["tasks"]}
    assert {name: tasks[name].get("outputs") or {} for name in local} == local, workers  # every output
    ran = {t.get("worker") for t in tasks.values() if t["kind"] == "video_encode"}
    assert len(ran) == workers, ran  # the encode tiles spread over every worker
    mp4 = farm_client.fetch_output(render_id, tmp_path / f"farm{workers}.mp4")
    assert _same(_frames(mp4), _frames(local_mp4))
    master = farm_client.fetch_output(render_id, hlg_path(mp4), file=HLG_FILE)
    assert _same(_frames(master, None), _frames(hlg_path(local_mp4), None))  # 10-bit planes
    assert farm_client.fetch_exr(render_id, tmp_path / f"exr{workers}") == FRAMES
    assert _same(_exr(tmp_path / f"exr{workers}"), exr)


@pytest.mark.timeout(600)
def test_the_grade_decoded_by_the_keyframe_aware_diffusion_decoder_equals_local(
    hdr_farm, diffusion_reference, clip, tmp_path
):
    farm_client, _procs, _ = hdr_farm
    local_mp4, local = diffusion_reference
    path, spec = clip
    farm_client.put_blob(path.read_bytes())
    render = wait_done(farm_client, farm_client.submit({**spec, **DIFFUSION}), timeout=400)
    tasks = {t["id"].removeprefix(f"{render['id']}."): t for t in render["tasks"]}
    tiles = [tasks[f"decode.t{i}"] for i in range(3)]
    assert "decode.t3" not in tasks and "slots" in local["stage1"]
    for tile in tiles:
        assert tile["params"]["decoder"] == "diffusion"
        assert (tile["params"]["keyframe_frames"], tile["params"]["keyframe_planes"]) == ([24], [0])
        assert tile["inputs"]["keyframes"] == tasks["stage1"]["outputs"]["slots"]  # the stage's seam slot
    assert tasks.keys() == local.keys()  # the same tasks, none missing or extra on the farm
    assert {name: tasks[name].get("outputs") or {} for name in local} == local  # every output
    mp4 = farm_client.fetch_output(render["id"], tmp_path / "farm.mp4")
    assert _same(_frames(mp4), _frames(local_mp4)) and len(_frames(mp4)) == FRAMES
    master = farm_client.fetch_output(render["id"], hlg_path(mp4), file=HLG_FILE)
    assert _same(_frames(master, None), _frames(hlg_path(local_mp4), None))  # 10-bit planes


def _submit(farm_client, data: Path, clip_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "FARM_DATA": str(data),
        "HOME": "/nonexistent",
        "FARM_TOKEN": (data / "token").read_text().strip(),
    }
    cmd = [
        *CLI,
        "submit",
        "-p",
        "a harbour",
        "-H",
        "64",
        "-W",
        "64",
        "-f",
        "9",
        "--hdr-ic-lora",
        str(clip_path),
        *args,
        "--coordinator",
        farm_client.address,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60, env=env)


@pytest.mark.timeout(180)
def test_bad_hdr_renders_are_refused_at_submit_through_the_cli(hdr_farm, clip, tmp_path):
    farm_client, _procs, data = hdr_farm
    before = len(farm_client.list())
    cases = [
        (("--pack", "tiny"), "hdr-ic-lora needs an LTX-2.5 pack; 'tiny' is LTX-2.3"),
        (
            ("--pack", "nolora25"),
            f"pack 'nolora25' has no hdr_lora ({HDR_LORA_FILE}): get it with `hf download "
            "Lightricks/LTX-2.5-22b-IC-LoRA-SDR-To-HDR",
        ),
        (
            ("--pack", "tiny25", "--exr", str(tmp_path / "e"), "--exr-colorspace", "rec2020"),
            "--exr-colorspace 'rec2020' is not one the farm writes",
        ),
        (("--pack", "tiny25", "--input-colorspace", "log"), "--input-colorspace 'log'"),
        (
            ("--pack", "tiny25", "--num-generated-keyframes", "1"),
            "(--hdr-ic-lora: it places its own keyframe slots at the clip's seams, and a stage takes one slot set)",
        ),
        (  # the grade's one stage runs the distilled table: a stage-2 table would be dropped
            ("--pack", "tiny25", "--stage2-sigmas", "0.9,0"),
            "--stage2-sigmas does not apply to the hdr-ic-lora recipe (--hdr-ic-lora)",
        ),
    ]
    for args, words in cases:
        refused = _submit(farm_client, data, clip[0], *args)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1 and words in lines[0], (
            args,
            refused.stderr[-2000:],
        )
    assert len(farm_client.list()) == before  # nothing queued
    taken = _submit(farm_client, data, clip[0], "--pack", "tiny25", "--no-keyframes")  # the CLI's own upload
    render_id = taken.stdout.strip().splitlines()[-1] if taken.stdout.strip() else ""
    assert taken.returncode == 0 and render_id, taken.stderr[-2000:]
    spec = farm_client.get(render_id)["spec"]
    assert spec["hdr_ic_lora"]["keyframes"] is False and spec["hdr"] and not spec["audio"]
    farm_client.cancel(render_id)


@pytest.mark.timeout(600)
def test_the_grade_ganged_over_both_workers_equals_local(hdr_farm, ganged_reference, reference, clip, tmp_path):
    """`--stage1-parallel 2`: the HDR stage (reference tokens, the seam's guide and slot split with the
    generated ones) leased to a gang of both workers; every output, the frames and the HLG master equal
    `--local`'s 2-way split, whose stage equals the unsplit stage's."""
    farm_client, _procs, _ = hdr_farm
    local_mp4, local = ganged_reference
    assert local["stage1"] == reference[2]["stage1"]  # the split stage is the unsplit one, bit for bit
    path, spec = clip
    start = time.monotonic()
    farm_client.put_blob(path.read_bytes())
    render = wait_done(farm_client, farm_client.submit({**spec, **GANGED}), timeout=300)
    print("ganged grade", f"{time.monotonic() - start:.1f} s")
    tasks = {t["id"].removeprefix(f"{render['id']}."): t for t in render["tasks"]}
    stage = tasks["stage1"]
    assert stage["metrics"]["stage1_parallel"] == 2, stage["metrics"].get("gang_broke")
    assert len(set(stage["ranks"])) == WORKERS, stage["ranks"]  # a gang of both workers ran it
    assert tasks.keys() == local.keys()
    assert {name: tasks[name].get("outputs") or {} for name in local} == local  # every output
    mp4 = farm_client.fetch_output(render["id"], tmp_path / "farm.mp4")
    assert _same(_frames(mp4), _frames(local_mp4)) and len(_frames(mp4)) == FRAMES
    master = farm_client.fetch_output(render["id"], hlg_path(mp4), file=HLG_FILE)
    assert _same(_frames(master, None), _frames(hlg_path(local_mp4), None))  # 10-bit planes
