"""The dashboard's schedule and login link in a real headless Chromium (items 4 and 6).

A render is driven through the real store's Lua scripts by three workers taking tasks side by side:
one attempt fails and is retried, one lease is lost with its worker, the rest finish; its decode is 15
tiles (3×5) whose place is their latent box, as the planner writes them. A second render has a task
running now. The page shows a Gantt view (a lane per worker, a bar per attempt over real time,
coloured by stage, the failure and the lost lease marked) for the render and for the farm's last
hour, the decode tiles as one grid by position, the render's seed, pack, tiling and output, and the
event feed; the renders list has no sideways scrollbar at 1400 px or on a 390 px phone. The login
link `farm dashboard` prints logs in and lands on the clean URL; a wrong one says so on the page.
Screenshots go to $FARM_SHOTS (default test-artifacts/)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.dashboard import start_dashboard, stop_dashboard
from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from tests.farm.cdp import Browser
from tests.farm.farm_harness import ROOT
from tests.farm.test_dashboard import WORKERS, chromium, tiled_tasks
from tests.farm.test_dashboard_browser import OVERFLOWING

RID, LIVE, BLK = "r20250101-130000-gantt1", "r20250101-130500-live22", "r20250101-131000-block3"
CNC, SRC = "r20250101-131500-cancl4", "r20250101-132000-clip55"
SHOTS = Path(os.environ.get("FARM_SHOTS") or ROOT / "test-artifacts")
OUT = {"out": "0" * 64}


def decode_tiles(rid: str, deps: list[str]) -> list[dict]:
    """15 decode tiles (1 × 3 × 5 latent boxes), shaped as plan/decode.py writes them."""
    rows, cols = [[0, 6], [5, 11], [10, 16]], [[0, 6], [5, 11], [10, 16], [15, 21], [20, 24]]
    return [{"id": f"{rid}.decode.t{i}", "kind": "decode_tile", "capability": "mlx", "max_attempts": 3,
             "params": {"tile_index": i, "tiles": 15, "latent": {"frames": [0, 4], "height": h, "width": w}},
             "inputs": {f"in{j}": {"task": d, "output": "out"} for j, d in enumerate(deps)}}
            for i, (h, w) in enumerate((h, w) for h in rows for w in cols)]


def graph(rid: str) -> list[dict]:
    tasks = [t for t in tiled_tasks(rid) if not t["id"].startswith(f"{rid}.decode")]
    last = [t["id"] for t in tasks if ".s2.step2." in t["id"]]
    return tasks + decode_tiles(rid, last)


def drive(store: FarmStore, rid: str) -> None:
    """Three workers lease side by side, hold their task a moment, then report; one failure (from round
    2 on, studio-2's) and one lost lease (from round 4 on, mbp-1's) on the way."""
    failed = lost = False
    for round_ in range(60):
        held = [(w, t) for w in WORKERS if (t := store.lease(w, ["mlx"], 60_000, seen=True))]
        if not held:
            assert failed and lost
            return
        time.sleep(0.15)
        for worker, task in held:
            if round_ >= 2 and worker == "studio-2" and not failed:
                failed = bool(store.fail(task["id"], worker, task["fence"], "Metal: insufficient memory for attention"))
            elif round_ >= 4 and worker == "mbp-1" and not lost:
                lost = bool(store.lose_leases(worker, "", "mbp-1 went to sleep", task["id"]))
            else:
                store.complete(task["id"], worker, task["fence"], OUT, {"seconds": 0.15})
        time.sleep(0.03)


@pytest.fixture(scope="module")
def farm_page(redis_server, tmp_path_factory) -> Iterator[tuple[FarmStore, str, Browser]]:
    """One store, one render history, one dashboard and one browser for the module."""
    client = connect(redis_server.url)
    client.flushdb()
    store = FarmStore(client)
    for name, chip in WORKERS.items():
        store.register_worker(name, {"host": f"{name}.local", "chip": chip, "memory_bytes": 128 * 2**30,
                                     "packs": ["tiny"]})
    spec = {"prompt": "a red fox running through fresh snow at dawn", "height": 512, "width": 768, "frames": 25,
            "seed": 42, "pack": "tiny", "stage2_tiles": "2x2", "decode_tiles": "48,192,192", "submitter": "ana"}
    assert store.create_render(RID, spec, graph(RID), priority=5)
    drive(store, RID)
    assert store.create_render(LIVE, {**spec, "prompt": "a heron at dusk", "seed": 7}, tiled_tasks(LIVE))
    running = store.lease("studio-1", ["mlx"], 60_000, seen=True)
    store.heartbeat(running["id"], "studio-1", running["fence"], 60_000, {"phase": "run"})
    assert store.create_render(CNC, {**spec, "prompt": "a lantern carried through a night market", "seed": 3},
                               tiled_tasks(CNC))
    text = store.lease("studio-2", ["mlx"], 60_000, seen=True)  # its text task runs when it is cancelled
    assert text["id"] == f"{CNC}.text" and store.cancel_render(CNC)
    store.complete(text["id"], "studio-2", text["fence"], OUT, {})  # the worker gives it back: not wanted
    clip = [{"id": f"{SRC}.source.t0", "kind": "video_encode", "capability": "mlx", "params": {}, "inputs": {}},
            {"id": f"{SRC}.decode", "kind": "decode_video", "capability": "mlx", "params": {},
             "inputs": {"in": {"task": f"{SRC}.source.t0", "output": "out"}}}]
    assert store.create_render(SRC, {**spec, "prompt": "a clip of waves, retaken", "decode_tiles": "80,512,768"}, clip)
    for _ in clip:  # the source encode, then the decode of the whole clip (its tile sizes cover it)
        task = store.lease("mbp-1", ["mlx"], 60_000, seen=True)
        store.complete(task["id"], "mbp-1", task["fence"], OUT, {"seconds": 0.2})
    blocked = [{"id": f"{BLK}.audio{i}", "kind": "decode_audio", "capability": "mlx", "params": {}, "inputs": {},
                "max_attempts": 3} for i in range(3)]
    assert store.create_render(BLK, {**spec, "prompt": "three failures", "seed": 9}, blocked)
    for _ in range(3):  # studio-2 fails three of its tasks: blocklisted for it
        task = store.lease("studio-2", ["mlx"], 60_000, seen=True)
        store.fail(task["id"], "studio-2", task["fence"], "NaN in the audio decode")
    store.drain_worker("mbp-1")
    assert store.lease("mbp-1", ["mlx"], 60_000, seen=True) is None  # draining, idle: it leaves
    store.register_worker("mini-1", {"host": "mini-1.local", "chip": "Apple M2 Pro", "packs": ["tiny"]},
                          session="s1")
    store.lose_leases("mini-1", "s1", "mini-1's connection broke")
    data = tmp_path_factory.mktemp("dash")
    server, port = start_dashboard(store, "127.0.0.1", 0, "sekrit", data_dir=data)
    browser = Browser(chromium())
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield store, f"http://127.0.0.1:{port}/", browser
    finally:
        browser.close()
        stop_dashboard(server)
        client.close()


def link_from_cli(url: str) -> str:
    result = subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", "dashboard",
                             "--no-open", "--url", url], capture_output=True, text=True, timeout=60, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "FARM_TOKEN": "sekrit"})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.timeout(120)
def test_login_link_logs_in_and_a_wrong_token_says_so_inline(farm_page) -> None:
    _store, url, browser = farm_page
    link = link_from_cli(url)
    assert link == f"{url}?token=sekrit"
    browser.goto(url + "?token=not-this-farms")  # a stale link: the page says so beside the form
    browser.wait_for("!document.getElementById('login-error').classList.contains('hidden')")
    assert "not this farm's" in browser.js("document.getElementById('login-error').textContent")
    assert browser.js("location.href") == url
    browser.js("window.alerted = []; window.alert = (m) => window.alerted.push(m);"
               "document.getElementById('login-token').value = 'wrong';"
               "document.getElementById('login').requestSubmit(); true")
    browser.wait_for("document.getElementById('login-error').textContent.startsWith('wrong farm token')")
    assert browser.js("window.alerted") == [] and browser.js("document.getElementById('session').textContent") \
        == "log in to see the farm"
    browser.goto(link)  # the link: logged in, and the address bar clean of the secret
    browser.wait_for("document.getElementById('session').textContent === 'operator'")
    assert browser.js("location.href") == url
    assert browser.js("document.getElementById('login-error').classList.contains('hidden')")


def bars(browser: Browser, box: str) -> list[dict]:
    return browser.js(f"[...document.querySelectorAll('#{box} .g-lane:not(.g-axis)')].map((l) => ({{worker: "
                      "l.dataset.worker, bars: [...l.querySelectorAll('.g-bar')].map((b) => [b.dataset.bar, "
                      "b.dataset.outcome, b.className, b.getBoundingClientRect().width])}))")


SCROLLS = "(() => { const p = document.getElementById('renders-pane'); return [p.scrollWidth, p.clientWidth]; })()"


@pytest.mark.timeout(120)
def test_gantt_grid_facts_feed_and_a_list_that_fits(farm_page) -> None:
    store, url, browser = farm_page
    browser.goto(f"{url}?token=sekrit")
    browser.wait_for("document.getElementById('session').textContent === 'operator'")
    browser.viewport(1400, 2300)
    browser.js(f"location.hash = 'render={RID}'; true")
    browser.wait_for("document.querySelectorAll('#render-gantt .g-bar').length > 20")
    lanes = bars(browser, "render-gantt")
    assert [lane["worker"] for lane in lanes] == sorted(WORKERS)
    every = [b for lane in lanes for b in lane["bars"]]
    assert len(every) == len(store.render_attempts(RID)) == len(graph(RID)) + 2  # one retry, one lost lease
    outcomes = [b[1] for b in every]
    assert outcomes.count("failed") == 1 and outcomes.count("lost") == 1 and outcomes.count("done") == len(graph(RID))
    assert all(b[3] >= 3 for b in every)
    assert sum("again" in b[2] for b in every) == 4  # both attempts of the retried and of the lost task
    assert {c.split()[1] for c in (b[2] for b in every)} >= {"st-text", "st-stage2", "st-decode", "st-audio"}

    grids = browser.js("[...document.querySelectorAll('#grids .grid')].map((g) => [g.querySelector('.label')"
                       ".textContent, g.querySelectorAll('.tile').length, g.querySelectorAll('.frame').length])")
    decode = [g for g in grids if g[0].startswith("Decode")]
    assert decode == [["Decode15/15", 15, 1]], grids  # one grid, laid out by position
    boxes = browser.js("[...document.querySelectorAll('#grids .grid')].find((g) => g.textContent.startsWith('Decode'))"
                       ".querySelectorAll('.tile').length && [...[...document.querySelectorAll('#grids .grid')]"
                       ".find((g) => g.textContent.startsWith('Decode')).querySelectorAll('.tile')]"
                       ".map((t) => t.style.left + ',' + t.style.top)")
    assert len(set(boxes)) == 15

    facts = browser.js("document.getElementById('facts').textContent")
    assert all(w in facts for w in ("seed42", "packtiny", "stage 2 tiles2x2", "decode tiles48,192,192", "output"))
    feed = browser.js("document.getElementById('render-feed').textContent")
    assert "lost its lease on mbp-1" in feed and "retried: Metal" in feed, feed
    farm_feed = browser.js("document.getElementById('farm-feed').textContent")
    for line in ("mbp-1 draining", "mbp-1 drained and left", f"studio-2 blocklisted for {BLK} after 3",
                 "mini-1 lost (mini-1's connection broke)", "retried: NaN in the audio decode"):
        assert line in farm_feed, (line, farm_feed)
    farm = bars(browser, "farm-gantt")
    assert {b[0].split(".")[0] for lane in farm for b in lane["bars"]} == {RID, LIVE, BLK, CNC, SRC}
    assert [b for lane in farm for b in lane["bars"] if b[1] == "running"][0][0].startswith(LIVE)
    width = browser.js(SCROLLS)
    assert width[0] <= width[1], f"the renders list scrolls sideways at 1400 px: {width}"
    shot_of(browser, "gantt-1400.png")

    browser.viewport(390, 3400, mobile=True)
    browser.wait_for("document.querySelectorAll('#render-gantt .g-bar').length > 20")
    time.sleep(1.2)  # a refresh redraws the axis for the narrow width
    width = browser.js(SCROLLS)
    assert width[0] <= width[1], f"the renders list scrolls sideways on a phone: {width}"
    shot_of(browser, "gantt-390.png")
    assert browser.js(OVERFLOWING) == [], "wider than a 390 px screen"
    assert browser.js("innerWidth") == 390  # a phone zooms out a page wider than its screen


def shot_of(browser: Browser, name: str) -> None:
    """The whole page, and the render's and the farm's schedules on their own (NAME-render, NAME-farm)."""
    browser.screenshot(SHOTS / name)
    stem = name.removesuffix(".png")
    browser.screenshot(SHOTS / f"{stem}-render.png", "#render")
    browser.screenshot(SHOTS / f"{stem}-farm.png", "#schedule-pane")
    assert all((SHOTS / n).stat().st_size > 5_000 for n in (name, f"{stem}-render.png", f"{stem}-farm.png"))


# The renders list as laid out: per row, the prompt cell's room against 30 characters of its prompt in its
# font, the cells whose text is cut (prompt and submitter are cut on purpose), badges past their cell;
# headers whose text does not fit their column (the next header's text would run into it).
LIST = """((CHARS) => {
  const ctx = document.createElement('canvas').getContext('2d');
  const rows = [...document.querySelectorAll('#renders tbody tr')].map((tr) => {
    const td = tr.querySelector('td.prompt'); const cs = getComputedStyle(td); ctx.font = cs.font;
    const room = td.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    return {room, need: ctx.measureText(td.textContent.padEnd(CHARS, 'n').slice(0, CHARS)).width,
      cut: [...tr.cells].filter((c) => c.offsetParent && !c.matches('.prompt, .by')
        && c.scrollWidth > c.clientWidth).map((c) => c.textContent),
      badge: [...tr.querySelectorAll('.pill')].filter((b) => b.getBoundingClientRect().right
        > b.closest('td').getBoundingClientRect().right).map((b) => b.textContent)};
  });
  const heads = [...document.querySelectorAll('#renders th')].filter((th) => th.offsetParent
    && th.scrollWidth > th.clientWidth).map((th) => th.textContent);
  return {rows, heads};
})"""
# Labels that touch or overlap on one line: each Gantt's time axis.
TICKS = """[...document.querySelectorAll('.g-axis')].filter((a) => a.offsetParent).map((a) =>
  [...a.querySelectorAll('.g-tick')].map((t) => t.getBoundingClientRect()).filter((r, i, all) =>
    i > 0 && r.left < all[i - 1].right).length)"""
SIDEWAYS = """['renders-pane', 'render-pane', 'schedule-pane', 'workers-pane'].map((id) => document.getElementById(id))
  .filter((p) => p.offsetParent).filter((p) => p.scrollWidth > p.clientWidth).map((p) => p.id)"""


def list_reads(browser: Browser, rows: int, chars: int = 30) -> None:
    """Every row shows `chars` characters of its prompt; no header, badge, ETA or age is cut."""
    browser.wait_for(f"document.querySelectorAll('#renders tbody tr').length === {rows}")
    laid = browser.js(f"{LIST}({chars})")
    assert laid["heads"] == [], f"headers cut or running together: {laid['heads']}"
    for row in laid["rows"]:
        assert row["room"] >= row["need"], f"prompt cell {row['room']:.0f} px < {chars} characters {row['need']:.0f} px"
        assert row["cut"] == [] and row["badge"] == [], row


@pytest.mark.timeout(120)
def test_the_list_reads_at_1400_px_and_a_phone_has_no_overlaps(farm_page) -> None:
    """1400 px: nothing picked, the list has the row (no empty pane); picked, the prompt still shows 30
    characters; headers, badges (`cancelled`), ETAs and ages fit. A clip's source-encode bars and legend
    have their colour, and a clip decoded whole says so. 390 px: no empty pane, no touching time labels,
    nothing scrolls sideways (the workers are cards)."""
    _store, url, browser = farm_page
    shots = SHOTS / "list"
    shots.mkdir(parents=True, exist_ok=True)
    browser.goto(f"{url}?token=sekrit")
    browser.wait_for("document.getElementById('session').textContent === 'operator'")
    browser.viewport(1400, 1000)
    renders = 5
    list_reads(browser, renders)
    assert browser.js("document.getElementById('render-pane').offsetParent") is None, "an empty detail pane"
    assert browser.js("document.getElementById('renders-pane').offsetWidth / document.querySelector('main')"
                      ".clientWidth") > 0.9
    browser.screenshot(shots / "list-1400.png")

    browser.js(f"location.hash = 'render={SRC}'; true")
    browser.wait_for("document.querySelectorAll('#render-gantt .g-bar').length === 2")
    list_reads(browser, renders)
    assert browser.js("document.getElementById('render-pane').offsetWidth") >= 540
    chip = browser.js("[...document.querySelectorAll('#render-gantt-legend span')].filter((s) => s.textContent === "
                      "'Source').map((s) => getComputedStyle(s).backgroundColor)")
    idle = browser.js("getComputedStyle(document.querySelector('#render-gantt .g-track')).backgroundColor")
    source = browser.js("getComputedStyle(document.querySelector('#render-gantt .g-bar.st-source')).backgroundColor")
    queued = browser.js("getComputedStyle(document.documentElement).getPropertyValue('--queued').trim()")
    assert chip and chip[0] == source and source not in ("rgba(0, 0, 0, 0)", idle), (chip, source, idle)
    assert source != browser.js(f"(() => {{ const e = document.createElement('i'); e.style.color = '{queued}';"
                                "document.body.append(e); const c = getComputedStyle(e).color; e.remove();"
                                "return c; })()"), "source bars in the grey of queued/idle"
    facts = browser.js("document.getElementById('facts').textContent")
    assert "decode tileswhole clip in one task" in facts, facts
    browser.screenshot(shots / "clip-1400.png")

    browser.js(f"location.hash = 'render={RID}'; true")
    browser.wait_for("document.querySelectorAll('#render-gantt .g-bar').length > 20")
    list_reads(browser, renders)
    assert browser.js(TICKS) == [0, 0] and browser.js(SIDEWAYS) == []
    browser.screenshot(shots / "picked-1400.png")

    browser.viewport(390, 3400, mobile=True)  # a window narrowed: the axes are laid out again at once
    assert browser.js(f"new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))).then(() => {TICKS})") \
        == [0, 0], "time labels crowd after a resize"
    browser.js("location.hash = ''; true")
    browser.wait_for("document.getElementById('render-pane').offsetParent === null")
    assert "Pick a render" not in browser.js("document.body.innerText")
    list_reads(browser, renders, chars=16)
    assert browser.js(TICKS) == [0] and browser.js(SIDEWAYS) == [], browser.js(SIDEWAYS)
    assert browser.js(OVERFLOWING) == [], "wider than a 390 px screen"
    browser.screenshot(shots / "list-390.png")
    for pane in ("renders-pane", "schedule-pane", "workers-pane"):
        browser.screenshot(shots / f"list-390-{pane}.png", f"#{pane}")
    browser.js(f"location.hash = 'render={RID}'; true")
    browser.wait_for("document.getElementById('render').offsetParent"
                     " && document.querySelectorAll('#render-gantt .g-bar').length > 20")
    assert browser.js(TICKS) == [0, 0] and browser.js(SIDEWAYS) == [], browser.js(SIDEWAYS)
    assert browser.js(OVERFLOWING) == [], "wider than a 390 px screen"
    browser.screenshot(shots / "picked-390.png")
    browser.screenshot(shots / "picked-390-render.png", "#render")
