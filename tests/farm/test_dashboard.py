"""The dashboard over a real store (throwaway redis-server) and real HTTP, plus headless Chromium."""

from __future__ import annotations

import hashlib
import http.client
import json
import shutil
import struct
import subprocess
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.dashboard import start_dashboard, stop_dashboard
from coordinator.state.store import FarmStore
from ltx_engine.rules.tiling import DimensionTilingConfig, TileCountConfig, plan_tiles
from tests.needs import require_program

ROOT = Path(__file__).resolve().parents[2]
GRID = (4, 16, 24)
STEPS = 3
WORKERS = {"studio-1": "Apple M2 Ultra", "studio-2": "Apple M3 Ultra", "mbp-1": "Apple M4 Max"}


def _iv(interval) -> list[int]:
    return [interval.start, interval.end]


def tiled_tasks(rid: str) -> list[dict]:
    """A two-stage graph whose stage 2 is 3 steps x 4 tiles and whose decode is 2 temporal tiles."""

    def task(name: str, kind: str, deps: list[str], params: dict | None = None, attempts: int = 3) -> dict:
        return {
            "id": f"{rid}.{name}",
            "kind": kind,
            "capability": "mlx",
            "params": params or {},
            "inputs": {f"in{i}": {"task": f"{rid}.{d}", "output": "out"} for i, d in enumerate(deps)},
            "max_attempts": attempts,
        }

    tasks = [
        task("text", "text_encode", []),
        task("stage1", "denoise_stage1", ["text"]),
        task("upsample", "upsample_spatial", ["stage1"]),
    ]
    counts = TileCountConfig(height=DimensionTilingConfig(2, 2), width=DimensionTilingConfig(2, 2))
    prev = ["upsample"]
    for step in range(STEPS):
        names = []
        for tile in plan_tiles(GRID, counts):
            names.append(f"s2.step{step}.tile{tile.index}")
            tile_params = {"frames": _iv(tile.frames), "height": _iv(tile.height), "width": _iv(tile.width)}
            tasks.append(
                task(
                    names[-1],
                    "denoise_stage2_tile",
                    prev,
                    {"step": step, "tile_index": tile.index, "tile": tile_params, "grid": list(GRID)},
                )
            )
        prev = names
    dec = TileCountConfig(frames=DimensionTilingConfig(2, 1))
    for tile in plan_tiles(GRID, dec):
        tasks.append(
            task(
                f"decode.tile{tile.index}",
                "decode_video_tile",
                prev,
                {
                    "tile_index": tile.index,
                    "grid": list(GRID),
                    "tile": {
                        "frames": _iv(tile.frames),
                        "height": _iv(tile.height),
                        "width": _iv(tile.width),
                    },
                },
            )
        )
    tasks.append(task("audio", "decode_audio", ["stage1"]))
    return tasks


def new_render(store: FarmStore, rid: str = "r20250101-120000-abc123") -> str:
    for name, chip in WORKERS.items():
        store.register_worker(
            name,
            {
                "host": f"{name}.local",
                "chip": chip,
                "memory_bytes": 128 * 2**30,
                "mlx_device": "Device(gpu, 0)",
                "packs": ["tiny"],
            },
        )
    spec = {
        "prompt": "a red fox running through fresh snow at dawn",
        "height": 512,
        "width": 768,
        "frames": 25,
        "submitter": "ana",
        "pack": "tiny",
    }
    assert store.create_render(rid, spec, tiled_tasks(rid), priority=5)
    return rid


def step_once(store: FarmStore, worker: str, progress: bool = True) -> dict | None:
    """Lease one task as `worker`, report a step, upload an output blob ref and complete it."""
    task = store.lease(worker, ["mlx"], 60_000)
    if task is None:
        return None
    if progress:
        store.heartbeat(task["id"], worker, task["fence"], 60_000, {"step": 1, "total": 2})
    data = task["id"].encode() * 100
    sha = hashlib.sha256(data).hexdigest()
    store.put_blob_ref(sha, f"/blobs/{sha}", len(data))
    store.complete(task["id"], worker, task["fence"], {"out": sha}, {"seconds": 0.5 + len(task["id"]) % 3})
    return task


def run_to_the_end(store: FarmStore, rid: str, fail_once: str | None = None) -> None:
    """Every task done (one failing once on its first attempt, when asked), then the mux."""
    names = list(WORKERS)
    for i in range(1000):
        worker = names[i % len(names)]
        task = store.lease(worker, ["mlx"], 60_000)
        if task is None:
            break
        if fail_once and task["id"].endswith(fail_once) and task["attempts"] == 1:
            store.fail(task["id"], worker, task["fence"], "Metal: insufficient memory for attention", True)
            continue
        store.heartbeat(task["id"], worker, task["fence"], 60_000, {"step": 1, "total": 2})
        store.complete(task["id"], worker, task["fence"], {"out": "0" * 64}, {"seconds": 0.25})
    store.set_render_state(rid, "assembling", stage="assemble")
    store.set_render_state(rid, "done", output="/tmp/out.mp4")


def partial_render(store: FarmStore) -> str:
    """Up to stage 1, audio and stage-2 step 0 done; step 1: two tiles done, one running, one retried."""
    rid = new_render(store)
    names = list(WORKERS)
    for i in range(3 + 1 + 4 + 2):
        assert step_once(store, names[i % 3]) is not None
    running = store.lease("studio-1", ["mlx"], 60_000)
    store.heartbeat(running["id"], "studio-1", running["fence"], 60_000, {"step": 1, "total": 3})
    broken = store.lease("mbp-1", ["mlx"], 60_000)
    store.fail(broken["id"], "mbp-1", broken["fence"], "Metal: insufficient memory for attention", True)
    return rid


def png_bytes(width: int = 192, height: int = 128) -> bytes:
    """A gradient PNG written with zlib (a stand-in for the last decoded frame)."""
    rows = b"".join(
        b"\x00" + bytes(v for x in range(width) for v in (x * 255 // width, y * 2 % 256, 150))
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@pytest.fixture
def dash(store: FarmStore, tmp_data: Path):
    server, port = start_dashboard(store, port=0, token="sekrit", data_dir=tmp_data)
    yield f"http://127.0.0.1:{port}", server
    stop_dashboard(server)


AUTH = {"Authorization": "Bearer sekrit"}  # the token the `dash` fixtures start with


def get_json(url: str, headers: dict | None = None) -> dict:
    """GET with the farm token (every read needs it)."""
    with urllib.request.urlopen(urllib.request.Request(url, headers=AUTH if headers is None else headers),
                                timeout=10) as resp:
        return json.loads(resp.read())


def post(url: str, headers: dict[str, str], body: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body or {}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_api_shapes_and_failure_text(store: FarmStore, dash) -> None:
    url, _ = dash
    rid = partial_render(store)
    renders = get_json(f"{url}/api/renders")["renders"]
    assert [r["id"] for r in renders] == [rid]
    row = renders[0]
    assert row["state"] == "running" and row["priority"] == 5 and row["submitter"] == "ana"
    assert 0 < row["progress"] < 1 and row["eta_s"] is not None and row["current_stage"] == "stage2"
    detail = get_json(f"{url}/api/renders/{rid}")
    assert detail["render"]["id"] == rid and len(detail["tasks"]) == 3 + 12 + 2 + 1
    stages = {s["name"]: s for s in detail["stages"]}
    assert stages["stage1"]["state"] == "done" and stages["stage1"]["duration_s"] is not None
    assert stages["stage2"]["state"] == "running" and stages["stage2"]["done"] == 6
    tiled = [g for g in detail["grids"] if g["tiled"]]
    assert [g["label"] for g in tiled] == ["Stage 2 step 0", "Stage 2 step 1", "Stage 2 step 2", "Decode"]
    assert len(tiled[3]["rows"]) == 2 and tiled[0]["aspect"] == pytest.approx(16 / 24)
    step1 = [t for row in tiled[1]["rows"] for t in row["tiles"]]
    assert sorted(t["display"] for t in step1) == ["done", "done", "retried", "running"]
    boxes = sorted(tuple(t["box"]) for t in step1)
    assert boxes[0][0] == 0.0 and boxes[-1][1] == 1.0  # cores partition the frame
    done = next(t for t in detail["tasks"] if t["display"] == "done")
    assert done["bytes_out"] > 0 and done["worker"] in WORKERS
    failure = detail["render"]["failures"]
    assert failure == [
        {
            "task": failure[0]["task"],
            "worker": "mbp-1",
            "attempts": 1,
            "error": "Metal: insufficient memory for attention",
        }
    ]
    assert detail["preview"] is None and detail["actions"] is True
    workers = {w["id"]: w for w in get_json(f"{url}/api/workers")["workers"]}
    assert workers["mbp-1"]["failures"] == 1 and workers["studio-1"]["state"] == "busy"
    assert (
        workers["studio-2"]["mean_s_per_tile"] is not None and workers["studio-1"]["chip"] == "Apple M2 Ultra"
    )
    summary = get_json(f"{url}/api/metrics-summary")
    assert summary["queue_depth"]["mlx"] >= 1 and summary["tasks_by_state"]["done"] == 10


def test_failed_tile_and_preview(store: FarmStore, dash, tmp_data: Path) -> None:
    url, _ = dash
    rid = new_render(store)
    step_once(store, "studio-1")
    task = store.lease("studio-2", ["mlx"], 60_000)
    store.fail(task["id"], "studio-2", task["fence"], "ValueError: NaN in tile output", retryable=False)
    detail = get_json(f"{url}/api/renders/{rid}")
    assert detail["render"]["state"] == "failed"
    assert detail["render"]["failures"][0]["worker"] == "studio-2"
    assert "NaN in tile output" in detail["render"]["failures"][0]["error"]
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(urllib.request.Request(f"{url}/api/renders/{rid}/preview.png", headers=AUTH), timeout=5)
    assert missing.value.code == 404
    (tmp_data / "previews").mkdir()
    (tmp_data / "previews" / f"{rid}.png").write_bytes(png_bytes())
    assert get_json(f"{url}/api/renders/{rid}")["preview"].startswith(f"/api/renders/{rid}/preview.png")
    with urllib.request.urlopen(urllib.request.Request(f"{url}/api/renders/{rid}/preview.png", headers=AUTH),
                                timeout=5) as resp:
        assert resp.headers["Content-Type"] == "image/png" and resp.read().startswith(b"\x89PNG")


def test_sse_delivers_events_emitted_after_connecting(store: FarmStore, dash) -> None:
    url, _ = dash
    rid = new_render(store)
    host, port = url[len("http://") :].split(":")
    for path in (f"/api/renders/{rid}/events", "/api/events"):
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", path, headers=AUTH)
        resp = conn.getresponse()
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        while resp.readline().strip() != b": connected":
            pass
        store.emit(rid, {"type": "probe", "path": path})
        data = None
        while data is None:
            line = resp.readline().decode().strip()
            if line.startswith("data: "):
                data = json.loads(line[6:])
        assert data["type"] == "probe" and data["path"] == path and data["render"] == rid
        conn.close()


def test_actions_need_token_and_csrf(store: FarmStore, dash) -> None:
    url, _ = dash
    rid = new_render(store)
    target = f"{url}/api/renders/{rid}/cancel"
    csrf = "c" * 32
    both_csrf = {"Cookie": f"farm_csrf={csrf}", "X-CSRF-Token": csrf}
    assert post(target, {})[0] == 403
    assert post(target, {"Authorization": "Bearer sekrit"})[0] == 403
    assert post(target, both_csrf)[0] == 403
    assert post(target, {**both_csrf, "Authorization": "Bearer wrong"})[0] == 403
    assert (
        post(
            target,
            {"Authorization": "Bearer sekrit", "Cookie": f"farm_csrf={csrf}", "X-CSRF-Token": "d" * 32},
        )[0]
        == 403
    )
    assert (
        post(target, {**both_csrf, "Authorization": "Bearer sekrit", "Origin": "http://evil.example"})[0]
        == 403
    )
    assert store.get_render(rid)["state"] == "queued"
    # The browser's way: log in (cookie), then act with the cookie and the CSRF header.
    req = urllib.request.Request(f"{url}/api/login", data=b"token=sekrit", method="POST", headers=both_csrf)
    with urllib.request.urlopen(req, timeout=10) as resp:
        cookie = resp.headers["Set-Cookie"]
    assert cookie.startswith("farm_session=") and "HttpOnly" in cookie and "sekrit" not in cookie
    session = {"Cookie": f"farm_csrf={csrf}; {cookie.split(';')[0]}", "X-CSRF-Token": csrf}
    assert post(target, session) == (200, {"render": rid, "cancelled": True})
    assert store.get_render(rid)["state"] == "cancelled"


def test_read_only_without_token(store: FarmStore) -> None:
    server, port = start_dashboard(store, port=0)
    try:
        rid = new_render(store)
        csrf = "c" * 32
        status, body = post(
            f"http://127.0.0.1:{port}/api/renders/{rid}/cancel",
            {"Cookie": f"farm_csrf={csrf}", "X-CSRF-Token": csrf, "Authorization": "Bearer x"},
        )
        assert status == 403 and "read-only" in body["error"]
    finally:
        stop_dashboard(server)


def scrape(url: str) -> dict[tuple, float]:
    with urllib.request.urlopen(urllib.request.Request(f"{url}/metrics", headers=AUTH), timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_metrics_parse_and_move(store: FarmStore, dash) -> None:
    url, _ = dash
    new_render(store)
    before = scrape(url)
    assert before[("farm_queue_depth", (("capability", "mlx"),))] == 1
    assert before[("farm_tasks", (("state", "queued"),))] == 1
    for _ in range(3):
        step_once(store, "studio-1")
    after = scrape(url)
    assert after[("farm_worker_tasks_done_total", (("worker", "studio-1"),))] == 3
    assert after[("farm_tasks", (("state", "done"),))] == 3
    assert after[("farm_stage_task_seconds_count", (("stage", "stage1"),))] == 1
    assert after[("farm_bytes_moved_bytes", (("direction", "out"),))] > 0
    assert after != before


def chromium() -> str:
    """The system's Chromium (`.ci/run` provisions it; missing, tests/needs.py's rule skips or fails)."""
    return require_program("chromium", "chromium-browser")


def headless(browser: str, url: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--window-size=1280,900",
        "--virtual-time-budget=5000",
        *extra,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, timeout=120, text=True)


@pytest.mark.timeout(1200)
def test_browser_screenshot(store: FarmStore, dash, tmp_data: Path, tmp_path: Path) -> None:
    browser = chromium()
    url, _ = dash
    rid = partial_render(store)
    store.create_render(
        "r20250101-115500-0f0f0f",
        {"prompt": "city timelapse at night", "submitter": "ben"},
        tiled_tasks("r20250101-115500-0f0f0f"),
    )
    (tmp_data / "previews").mkdir()
    (tmp_data / "previews" / f"{rid}.png").write_bytes(png_bytes())
    page = f"{url}/#render={rid}&token=sekrit"  # the page logs in with a token in its fragment
    dom = headless(browser, page, "--dump-dom").stdout
    assert 'data-state="done"' in dom and 'data-state="running"' in dom and "studio-1" in dom
    assert "insufficient memory" in dom and "city timelapse" not in dom.split("<tbody>")[0]
    shot = tmp_path / "dashboard.png"
    proc = headless(browser, page, f"--screenshot={shot}")
    assert shot.is_file(), proc.stderr[-2000:]
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    shutil.copyfile(shot, artifacts / "dashboard.png")
    # Tiles turn done (the running one, the retried one, then step 2); the page shows them.
    running = next(t for t in store.render_tasks(rid) if t["state"] == "leased")
    store.complete(running["id"], "studio-1", running["fence"], {"out": "0" * 64}, {"seconds": 1.5})
    for _ in range(3):
        step_once(store, "studio-2")
    dom = headless(browser, page, "--dump-dom").stdout
    done = sum(t["state"] == "done" for t in store.render_tasks(rid))
    assert done >= 13 and dom.count('data-state="done"') == done and 'data-state="running"' not in dom
