"""One render through the real farm (throwaway Redis, gRPC coordinator, worker subprocesses, MLX on the
tiny pack) must equal `farm render --local` bit for bit, also when a worker is killed mid-stage-1."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import av
import pytest

from farm_cli.local import render_local
from ltx_engine.fingerprint import forward_fingerprint
from protos import installed
from tests.farm.farm_harness import assert_identical, farm, farm_results, local_results, wait_done

SPEC = {"prompt": "a fox", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 3, "pack": "tiny"}


@pytest.fixture(scope="module")
def reference(tiny_packs, local_runner, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "b.mp4"
    path, outputs, blobs = render_local(SPEC, out, local_runner)
    return path, local_results(outputs, blobs)


@pytest.mark.timeout(420)
def test_farm_render_equals_local_reference(store, tmp_data, tiny_packs, reference, tmp_path):
    local_mp4, local_arrays = reference
    with farm(store, tmp_data, tiny_packs, workers=2) as (client, _procs):
        render_id = client.submit(dict(SPEC))
        render = wait_done(client, render_id)
        arrays = farm_results(client, render)
        mp4 = client.fetch_output(render_id, tmp_path / "a.mp4")
    assert_identical(arrays, local_arrays)
    with av.open(str(mp4)) as container:
        video = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) == 25 and frames[0].shape == (256, 384, 3)
        assert float(video.average_rate) == 24.0
        assert len(container.streams.audio) == 1
    with av.open(str(local_mp4)) as container:
        local_frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert all((a == b).all() for a, b in zip(frames, local_frames, strict=True))
    workers = {t["worker"] for t in render["tasks"]}
    assert workers <= {"w1", "w2"}
    made = json.loads((tmp_data / "renders" / render_id / "render.json").read_text())["provenance"]
    assert set(made["tasks"]) == {t["id"].removeprefix(f"{render_id}.") for t in render["tasks"]
                                  if t["worker"] in ("w1", "w2")}  # every worker output says what made it
    assert made["classes"] == [forward_fingerprint()]  # one machine: one class
    assert all(m["chip"] == installed.chip_name() and m["project_version"] == installed.project_version()
               for m in made["tasks"].values())


@pytest.mark.timeout(420)
def test_killed_worker_loses_nothing(store, tmp_data, tiny_packs, reference):
    _, local_arrays = reference
    with farm(store, tmp_data, tiny_packs, workers=2, lease_ms=3000) as (client, procs):
        render_id = client.submit(dict(SPEC))
        killed: list[str] = []

        def killer() -> None:
            for event in client.watch(render_id):
                if event.get("type") == "task_leased" and str(event.get("task", "")).endswith(".stage1"):
                    worker = event["worker"]
                    time.sleep(0.15)  # let it get into the denoising loop
                    os.kill(procs[worker].pid, signal.SIGKILL)
                    killed.append(worker)
                    return

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        render = wait_done(client, render_id)
        thread.join(timeout=5)
        events = list(client.watch(render_id))
        arrays = farm_results(client, render)
    assert killed, "the stage-1 lease was never seen"
    stage1 = next(t for t in render["tasks"] if t["id"].endswith(".stage1"))
    assert stage1["worker"] != killed[0] and int(stage1["attempts"]) >= 2
    assert any(e.get("type") in ("task_lost", "task_expired") and e.get("task", "").endswith(".stage1") for e in events)
    assert_identical(arrays, local_arrays)


def test_assembly_writes_preview_thumbnails(tmp_path):
    """The dashboard's previews: the latest finished frame and a contact strip, as real PNGs (read back
    with PyAV's PNG decoder)."""
    import numpy as np

    from coordinator.assemble.previews import PreviewWriter

    frames = [np.full((256, 384, 3), i / 24.0, np.float32) for i in range(25)]
    writer = PreviewWriter(tmp_path / "previews" / "r1.png", total_frames=25)
    for frame in frames:
        writer.add(frame)
    writer.close()
    with av.open(str(tmp_path / "previews" / "r1.png")) as container:
        last = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert last.shape == (128, 192, 3) and int(last[0, 0, 0]) == 255
    with av.open(str(tmp_path / "previews" / "r1-strip.png")) as container:
        strip = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert strip.shape == (128, 192 * 8, 3)


@pytest.mark.timeout(420)
def test_coordinator_restart_resumes_an_unfinished_assembly(store, tmp_data, tiny_packs):
    """A coordinator that died while assembling: the next one finds the render in Redis and finishes it."""
    from coordinator.server import serve, stop

    with farm(store, tmp_data, tiny_packs, workers=2) as (client, _procs):
        render_id = client.submit(dict(SPEC))
        wait_done(client, render_id)
    # What a crash mid-assembly leaves behind: every task done, the render still assembling, no mp4.
    store.client.hset(store.key("render", render_id), mapping={"state": "assembling", "output": ""})
    (tmp_data / "renders" / render_id / "render.mp4").unlink()
    server, port = serve(store, tmp_data, "127.0.0.1", 0, (tmp_data / "token").read_text().strip())
    try:
        deadline = time.monotonic() + 120
        while store.get_render(render_id)["state"] != "done" and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop(server)
    render = store.get_render(render_id)
    assert render["state"] == "done" and (tmp_data / "renders" / render_id / "render.mp4").is_file()
    with av.open(render["output"]) as container:
        assert sum(1 for _ in container.decode(video=0)) == 25
