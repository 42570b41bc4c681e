"""The dashboard's fixes seen through real HTTP and headless Chromium: no `null` text, running vs leased
tiles, renders (not tasks) in the header, a prompt column, people's names for tasks, the video route."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from coordinator.dashboard import start_dashboard, stop_dashboard
from coordinator.state.store import FarmStore
from coordinator.views import metrics
from tests.farm.test_dashboard import AUTH, ROOT, chromium, headless, new_render, run_to_the_end, step_once

MP4 = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 40


@pytest.fixture
def dash(store: FarmStore, tmp_data: Path):
    server, port = start_dashboard(store, port=0, token="sekrit", data_dir=tmp_data)
    yield f"http://127.0.0.1:{port}", server
    stop_dashboard(server)


def fetch(url: str, headers: dict | None = None) -> tuple[int, Any, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
            return resp.status, resp.headers, resp.read()  # headers: any case, as HTTP says
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def finished(store: FarmStore, tmp_path: Path, rid: str = "r20250101-120000-abc123") -> str:
    new_render(store, rid)
    run_to_the_end(store, rid)
    video = tmp_path / "out.mp4"
    video.write_bytes(MP4)
    store.client.hset(store.key("render", rid), "output", str(video))  # where the assembler put it
    return rid


def test_video_is_served_only_with_the_token_and_seeks(store: FarmStore, dash, tmp_path: Path) -> None:
    url, _ = dash
    rid = finished(store, tmp_path)
    video = f"{url}/api/renders/{rid}/video.mp4"
    assert fetch(video)[0] == 403
    assert fetch(video, {"Authorization": "Bearer wrong"})[0] == 403
    status, headers, body = fetch(video, {"Authorization": "Bearer sekrit"})
    assert status == 200 and body == MP4 and headers["Content-Type"] == "video/mp4"
    status, headers, body = fetch(video, {"Authorization": "Bearer sekrit", "Range": "bytes=16-31"})
    assert status == 206 and body == MP4[16:32] and headers["Content-Range"] == f"bytes 16-31/{len(MP4)}"
    status, headers, _ = fetch(video + "?download=1", {"Authorization": "Bearer sekrit"})
    assert f'filename="{rid}.mp4"' in headers["Content-Disposition"]
    new_render(store, "r20250101-130000-def456")
    assert fetch(f"{url}/api/renders/r20250101-130000-def456/video.mp4", {"Authorization": "Bearer sekrit"})[0] == 404


def test_a_worker_computing_its_tile_reads_running(store: FarmStore) -> None:
    rid = new_render(store)
    task = store.lease("studio-1", ["mlx"], 60_000)
    assert metrics.display_state(store.get_task(task["id"])) == "leased"  # handed out, inputs on the way
    store.heartbeat(task["id"], "studio-1", task["fence"], 60_000, {"phase": "run"})
    assert metrics.display_state(store.get_task(task["id"])) == "running"
    assert rid


@pytest.mark.timeout(300)
def test_page_shows_people_words_and_no_null(store: FarmStore, dash, tmp_path: Path) -> None:
    browser = chromium()
    url, _ = dash
    rid = finished(store, tmp_path)
    live = new_render(store, "r20250101-121500-aaa111")
    for _ in range(4):
        step_once(store, "studio-2")
    task = store.lease("studio-1", ["mlx"], 60_000)
    store.heartbeat(task["id"], "studio-1", task["fence"], 60_000, {"phase": "run"})
    locked = headless(browser, f"{url}/#render={rid}", "--dump-dom").stdout  # no token: the login form only
    assert "a red fox" not in locked and "log in to see the farm" in locked, locked[-2000:]
    done_dom = headless(browser, f"{url}/#render={rid}&token=sekrit", "--dump-dom").stdout
    actions = done_dom.split('id="render-actions"')[1].split("</div>")[0]
    assert "null" not in actions and "cancel" not in actions, actions
    assert f'src="/api/renders/{rid}/video.mp4"' in done_dom  # logged in: the player is there
    header = done_dom.split('id="farm-stats"')[1].split("</div>")[0]
    assert "renders queued" in header and "rendering <b>1</b>" in header and "done <b>1</b>" in header, header
    live_dom = headless(browser, f"{url}/#render={live}&token=sekrit", "--window-size=1400,1000", "--dump-dom").stdout
    assert 'data-state="running"' in live_dom, live_dom[-3000:]
    renders_table = live_dom.split('id="renders"')[1].split("</table>")[0]
    assert "a red fox running through fresh snow" in renders_table and ">ana<" in renders_table
    assert "· cut" not in live_dom and "(denoise_stage2_tile)" not in live_dom
    shot = tmp_path / "dashboard-live.png"
    headless(browser, f"{url}/#render={live}&token=sekrit", f"--screenshot={shot}", "--window-size=1400,1000")
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    (ROOT / "test-artifacts" / "dashboard-1400.png").write_bytes(shot.read_bytes())


def test_task_log_lines_reach_the_page_data(store: FarmStore, dash) -> None:
    import json

    url, _ = dash
    rid = new_render(store)
    task = store.lease("studio-1", ["mlx"], 60_000)
    store.complete(task["id"], "studio-1", task["fence"], {"out": "0" * 64},
                   {"seconds": 1.0, "log": ["12:00:01 INFO farm.worker: task started", "12:00:02 INFO done"]})
    assert fetch(f"{url}/api/renders/{rid}")[0] == 401  # every read needs the token
    status, _, body = fetch(f"{url}/api/renders/{rid}", AUTH)
    view = next(t for t in json.loads(body)["tasks"] if t["id"] == task["id"])
    assert status == 200 and view["log"][-1] == "12:00:02 INFO done" and view["label"] == "text encoding"
