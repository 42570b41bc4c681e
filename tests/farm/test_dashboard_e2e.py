"""The dashboard over a real render: a farm renders a tiled clip while headless Chromium watches the
tile grid turn done, then the finished page shows the renders list, the grid and the preview."""

from __future__ import annotations

import shutil
import time

import pytest

from coordinator.dashboard import start_dashboard, stop_dashboard
from tests.farm.farm_harness import ROOT, farm, wait_done
from tests.farm.test_dashboard import chromium, headless

SPEC = {"prompt": "a fox crossing a snowfield", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0,
        "seed": 9, "pack": "tiny", "stage2_tiles": "2x2", "tile_overlap": 5}


@pytest.mark.timeout(600)
def test_dashboard_follows_a_real_tiled_render(store, tmp_data, tiny_packs, tmp_path):
    browser = chromium()
    with farm(store, tmp_data, tiny_packs, workers=2) as (client, _procs):
        server, port = start_dashboard(store, "127.0.0.1", 0, None, data_dir=tmp_data)
        try:
            render_id = client.submit(dict(SPEC))
            page = f"http://127.0.0.1:{port}/#render={render_id}&live=0"
            seen: list[int] = []
            deadline = time.monotonic() + 300
            while client.get(render_id)["state"] not in ("done", "failed") and time.monotonic() < deadline:
                dom = headless(browser, page, "--dump-dom").stdout
                seen.append(dom.count('data-state="done"'))
            render = wait_done(client, render_id)
            dom = headless(browser, page, "--dump-dom").stdout
            shot = tmp_path / "dashboard-real.png"
            headless(browser, page, f"--screenshot={shot}", "--window-size=1280,1100")
        finally:
            stop_dashboard(server)
    done_tasks = sum(t["state"] == "done" for t in render["tasks"])
    assert seen == sorted(seen), f"done tiles went backwards: {seen}"
    assert dom.count('data-state="done"') >= done_tasks - 1  # every task drawn; mux is a stage, not a tile
    assert render_id.split("-", 1)[1] in dom and "w1" in dom and "w2" in dom
    assert (tmp_data / "previews" / f"{render_id}.png").is_file()
    assert f"/api/renders/{render_id}/preview.png" in dom
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    shutil.copyfile(shot, ROOT / "test-artifacts" / "dashboard-real-render.png")
