"""A worker whose advertised memory is below the tiny pack's resident DiT peak (but above its streamed one)
is leased the DiT tasks anyway and runs them with the blocks streamed: tiled stage 2 equals `--local`
bit for bit."""

from __future__ import annotations

import time

import pytest

from farm_cli.local import render_local
from tests.farm.farm_harness import assert_identical, farm, farm_results, local_results, wait_done

SPEC = {"prompt": "a fox", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 5, "pack": "tiny",
        "stage2_tiles": "2x2", "tile_overlap": 5, "decode_tiles": "off"}  # decode sizes do not scale with the pack
# The tiny pack's DiT tasks need ~14 MB resident and ~1 MB streamed by the cost model (its weights are
# 12 MB); its text encoder ~7.4 MB. An 8 MB worker holds everything, the DiT only streamed.
SMALL_MB = "8"


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
    monkeypatch.setenv("FARM_WORKER_MEMORY_MB", SMALL_MB)
    monkeypatch.setenv("FARM_MODEL_BUDGET_MB", "1024")  # keep its models warm; only the advertised memory is small
    with farm(store, tmp_data, tiny_packs, workers=1) as (client, _procs):
        _registered(client)  # the plan's memory figures come from the registered worker's pack size
        render = wait_done(client, client.submit(SPEC))
        assert_identical(farm_results(client, render), reference)
    dit = [t for t in render["tasks"] if t["kind"] in ("denoise_stage1", "transformer_forward")]
    assert len(dit) == 1 + 8
    for task in dit:
        params = task["params"]
        assert params["min_memory_bytes"] > int(SMALL_MB) * 2**20 >= params["min_memory_stream_bytes"]
        assert task["metrics"].get("streamed") is True, task["metrics"]
    others = [t for t in render["tasks"] if t["kind"] == "text_encode"]
    assert others and not others[0]["metrics"].get("streamed")
