"""A worker whose advertised memory is below the tiny pack's resident DiT peak (but above its streamed one)
is leased the DiT tasks anyway and runs them with the blocks streamed: tiled stage 2 equals `--local`
bit for bit. On the same farm, a pack file truncated while the worker streams from it fails that render
with the file's name, and the worker keeps serving: once the file is whole again the next render is done.
A render with an unfused LoRA set (run-time adapters) streams there too and equals `--local` bit for bit."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from farm_cli.local import render_local
from tests.farm.farm_harness import assert_identical, farm, farm_results, local_results, wait_done, wait_until
from tests.farm.user_loras import write_user_loras

SPEC = {"prompt": "a fox", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 5, "pack": "tiny",
        "stage2_tiles": "2x2", "tile_overlap": 5, "decode_tiles": "off"}  # decode sizes do not scale with the pack
# The tiny pack's DiT tasks need ~14 MB resident and ~1 MB streamed by the cost model (its weights are
# 12 MB); its text encoder ~7.4 MB. An 8 MB worker holds everything, the DiT only streamed.
SMALL_MB = "8"
SMALLEST = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "seed": 3, "pack": "tiny", "audio": False,
            "decode_tiles": "off"}  # one streamed stage-1 task and one stage-2 task: the cheapest render that streams
UNFUSED = {**SMALLEST, "seed": 4, "lora_mode": "unfused",  # two stacked LoRAs (two layouts), pack files
           "loras": [{"file": "style-lora.safetensors", "strength": 0.8}, {"file": "camera-lora.safetensors",
                                                                           "strength": 0.5}]}


def _registered(client, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not any(w.get("memory_bytes") for w in client.workers()):
        assert time.monotonic() < deadline, "the worker never registered"
        time.sleep(0.2)
    assert [w["memory_bytes"] for w in client.workers()] == [int(SMALL_MB) * 2**20]


@pytest.mark.timeout(600)
def test_a_worker_below_the_resident_peak_streams_and_matches_local(store, tmp_data, tiny_packs, local_runner,
                                                                     tmp_path, monkeypatch):
    _, outputs, blobs = render_local(SPEC, tmp_path / "local.mp4", local_runner)
    reference = local_results(outputs, blobs)
    packs = tmp_path / "packs"  # the worker's own copy: this test truncates a file of it
    shutil.copytree(tiny_packs, packs)
    for lora, path in zip(UNFUSED["loras"], write_user_loras(tmp_path / "loras", packs / "tiny"), strict=True):
        shutil.copy(path, packs / "tiny" / lora["file"])
    from worker.runner import Runner

    _, outputs, blobs = render_local(UNFUSED, tmp_path / "unfused.mp4", Runner(packs))
    unfused_reference = local_results(outputs, blobs)
    monkeypatch.setenv("FARM_WORKER_MEMORY_MB", SMALL_MB)
    monkeypatch.setenv("FARM_MODEL_BUDGET_MB", "1024")  # keep its models warm; only the advertised memory is small
    with farm(store, tmp_data, packs, workers=1) as (client, procs):
        _registered(client)  # the plan's memory figures come from the registered worker's pack size
        render = wait_done(client, client.submit(SPEC))
        assert_identical(farm_results(client, render), reference)
        _truncated_pack_file_fails_the_render_and_the_worker_serves_on(client, procs, packs / "tiny")
        unfused = wait_done(client, client.submit(UNFUSED), timeout=120)
        assert_identical(farm_results(client, unfused), unfused_reference)
    streamed = [t for t in unfused["tasks"] if t["kind"] in ("denoise_stage1", "denoise_stage2")]
    assert len(streamed) == 2 and all(t["metrics"].get("streamed") for t in streamed), [t["metrics"] for t in streamed]
    assert sum(t["metrics"]["lora_fusions"] for t in streamed) >= 1  # the adapters attached to a streamed DiT
    dit = [t for t in render["tasks"] if t["kind"] in ("denoise_stage1", "transformer_forward")]
    assert len(dit) == 1 + 8
    for task in dit:
        params = task["params"]
        assert params["min_memory_bytes"] > int(SMALL_MB) * 2**20 >= params["min_memory_stream_bytes"]
        assert task["metrics"].get("streamed") is True, task["metrics"]
    others = [t for t in render["tasks"] if t["kind"] == "text_encode"]
    assert others and not others[0]["metrics"].get("streamed")


def _truncated_pack_file_fails_the_render_and_the_worker_serves_on(client, procs, pack: Path) -> None:
    """The worker holds the streamed DiT (its header read, its blocks read again at every forward): the
    file cut short under it fails the next streamed task, naming the file; restored, the next render runs."""
    dit = pack / "transformer-distilled.safetensors"
    whole = dit.read_bytes()
    with open(dit, "r+b") as f:
        f.truncate(len(whole) // 2)
    broken = client.submit(SMALLEST)
    wait_until(lambda: client.get(broken)["state"] in ("failed", "done"), 120, "the render on a truncated pack ends")
    render = client.get(broken)
    assert render["state"] == "failed", render["state"]
    assert str(dit) in render["error"] and "truncated while streaming" in render["error"], render["error"]
    dit.write_bytes(whole)
    again = wait_done(client, client.submit(SMALLEST), timeout=120)
    assert {t["worker"] for t in again["tasks"] if t["kind"] == "denoise_stage1"} == {"w1"}
    assert all(t["metrics"].get("streamed") for t in again["tasks"] if t["kind"] == "denoise_stage1")
    assert procs["w1"].poll() is None  # the same process served both
