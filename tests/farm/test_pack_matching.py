"""Two real workers hold the same pack name, one without its spatial upscaler: the render is accepted
(the farm as a whole holds every part), each upsample goes to the worker that holds the upscaler,
and the result equals the in-process reference."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.farm.farm_harness import (
    assert_identical,
    farm,
    farm_results,
    local_results,
    start_worker,
    wait_done,
)

SPEC = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "frame_rate": 24.0, "seed": 5, "pack": "tiny"}


def _registered(store, names: set[str], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = {w["id"] for w in store.list_workers() if (w.get("info") or {}).get("pack_components")}
        if names <= seen:
            return
        time.sleep(0.2)
    raise AssertionError(f"workers {names} never registered their packs")


@pytest.mark.timeout(400)
def test_tasks_go_to_the_worker_whose_pack_holds_their_components(store, tmp_data, tiny_packs, local_reference,
                                                                    tmp_path):
    _, outputs, blobs = local_reference(SPEC)  # the session's: test_pack_sync renders the same spec
    partial = tmp_path / "partial"
    shutil.copytree(tiny_packs / "tiny", partial / "tiny")
    (partial / "tiny" / "spatial_upscaler_x2_v1_1.safetensors").unlink()
    with farm(store, tmp_data, tiny_packs, workers=1) as (client, _procs):
        token = (tmp_data / "token").read_text().strip()
        second = start_worker(client.address, token, partial, "w2", tmp_data)
        try:
            _registered(store, {"w1", "w2"})
            render = wait_done(client, client.submit(dict(SPEC)))
            arrays = farm_results(client, render)
        finally:
            second.terminate()
            try:
                second.wait(timeout=10)
            except subprocess.TimeoutExpired:
                second.kill()
    upsample = next(t for t in render["tasks"] if t["id"].endswith(".upsample"))
    assert upsample["worker"] == "w1" and int(upsample["attempts"]) == 1
    assert_identical(arrays, local_results(outputs, blobs))
