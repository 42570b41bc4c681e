"""Retrying a failed or cancelled render in place (#14): under its own id, only the tasks that had not
finished run again, and the result is bit-identical to `farm render --local`. Refused (nothing
changed) when a blob it needs is gone, or while it is still live. Through the dashboard's retry
button's API and the store's one Lua script, on a real farm."""

from __future__ import annotations

import pytest

from coordinator.dashboard import start_dashboard, stop_dashboard
from farm_cli.local import render_local
from tests.farm.farm_harness import assert_identical, farm, farm_results, local_results, wait_done
from tests.farm.test_dashboard import new_render, post, step_once

SPEC = {"prompt": "a heron at dusk", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 11,
        "pack": "tiny"}
CSRF = "c" * 32
HEADERS = {"Authorization": "Bearer sekrit", "Cookie": f"farm_csrf={CSRF}", "X-CSRF-Token": CSRF}


def test_retry_keeps_finished_tasks_and_refuses_what_it_cannot_finish(store, tmp_data) -> None:
    rid = new_render(store)
    for _ in range(3):
        step_once(store, "studio-1")  # text, stage 1, upsample done
    straggler = store.lease("studio-2", ["mlx"], 60_000)
    server, port = start_dashboard(store, port=0, token="sekrit", data_dir=tmp_data)
    url = f"http://127.0.0.1:{port}/api/renders/{rid}/retry"
    try:
        assert post(url, HEADERS) == (200, {"render": rid, "outcome": "live"})
        assert post(url, {"Authorization": "Bearer sekrit"})[0] == 403  # no CSRF: refused
        assert store.cancel_render(rid)
        before = {t["id"]: t for t in store.render_tasks(rid)}
        kept = sorted(tid for tid, t in before.items() if t["state"] == "done")
        sha = next(iter(before[kept[0]]["outputs"].values()))
        store.client.rename(store.key("blob", sha), store.key("blob", "moved"))  # a kept output's blob gone
        assert post(url, HEADERS)[1]["outcome"] == "gone" and store.get_render(rid)["state"] == "cancelled"
        store.client.rename(store.key("blob", "moved"), store.key("blob", sha))
        assert post(url, HEADERS) == (200, {"render": rid, "outcome": "retried"})
    finally:
        stop_dashboard(server)
    after = {t["id"]: t for t in store.render_tasks(rid)}
    assert sorted(tid for tid, t in after.items() if t["state"] == "done") == kept
    assert all(after[tid]["done_ms"] == before[tid]["done_ms"] for tid in kept)  # not run again
    assert {t["state"] for tid, t in after.items() if tid not in kept} <= {"queued", "waiting"}
    assert store.get_render(rid)["state"] == "running" and store.get_render(rid)["remaining"] == len(after) - 3
    # The straggler leased before the cancel reports late: stale, and its task runs afresh.
    assert store.complete(straggler["id"], "studio-2", straggler["fence"], {"out": "0" * 64}, {}) == "stale"
    assert store.get_task(straggler["id"])["state"] == "queued"


@pytest.mark.timeout(600)
def test_a_cancelled_render_retried_in_place_is_identical_to_local(store, tmp_data, tiny_packs, local_runner,
                                                                   tmp_path) -> None:
    _, outputs, blobs = render_local(dict(SPEC), tmp_path / "local.mp4", local_runner)
    with farm(store, tmp_data, tiny_packs, workers=2) as (client, _procs):
        render_id = client.submit(dict(SPEC))
        for event in client.watch(render_id):
            if event.get("type") == "task_done" and str(event.get("task")).endswith(".upsample"):
                break
        assert client.cancel(render_id)
        kept = {t["id"]: t["done_ms"] for t in store.render_tasks(render_id) if t["state"] == "done"}
        server, port = start_dashboard(store, port=0, token="sekrit", data_dir=tmp_data)
        try:
            status, body = post(f"http://127.0.0.1:{port}/api/renders/{render_id}/retry", HEADERS)
        finally:
            stop_dashboard(server)
        assert (status, body["outcome"]) == (200, "retried")
        render = wait_done(client, render_id)
        arrays = farm_results(client, render)
    assert len(kept) >= 3  # text, stage 1 and the upsample stayed done
    assert {t["id"]: t["done_ms"] for t in render["tasks"] if t["id"] in kept} == kept
    assert_identical(arrays, local_results(outputs, blobs))


@pytest.mark.timeout(120)
def test_farm_retry_reruns_in_place_and_with_new_renders_anew(store, tmp_data, tiny_packs) -> None:
    """`farm retry ID` over real gRPC: the same id back, queued again; --new submits the spec anew."""
    import os
    import subprocess
    import sys

    from coordinator.server import serve, stop
    from farm_cli.client import FarmClient
    from tests.farm.farm_harness import ROOT, join_token
    from tests.farm.test_fuzz import CAPABILITIES

    server, port = serve(store, tmp_data, token="t" * 16, packs_dir=tiny_packs)
    address, token = f"127.0.0.1:{port}", join_token(tmp_data, "t" * 16)

    def farm(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", *args,
                               "--coordinator", address], capture_output=True, text=True, cwd=ROOT, timeout=60,
                              env={**os.environ, "FARM_TOKEN": token})

    try:
        store.register_worker("mac-1", CAPABILITIES)
        with FarmClient(address, token) as client:
            rid = client.submit(dict(SPEC))
            assert client.cancel(rid)
            again = farm("retry", rid)
            assert (again.returncode, again.stdout.strip()) == (0, rid), again.stderr
            assert store.get_render(rid)["state"] == "queued"
            live = farm("retry", rid)
            assert live.returncode == 1 and f"render {rid} is queued" in live.stdout + live.stderr
            assert client.cancel(rid)
            anew = farm("retry", rid, "--new")
            fresh = anew.stdout.strip()
            assert anew.returncode == 0 and fresh.startswith("r") and fresh != rid, anew.stderr
            assert client.get(fresh)["spec"]["prompt"] == SPEC["prompt"]
    finally:
        stop(server)
