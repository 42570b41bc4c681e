"""The dashboard in a real headless Chromium, driven over DevTools: log in, the renders list, a render
with a tile running, the task popover with the worker's log lines, the drain and resume buttons, the
finished render's mp4 playing in the page and downloading, and the page on a 390 px phone screen with
nothing overflowing. Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.dashboard import start_dashboard, stop_dashboard
from tests.farm.cdp import Browser
from tests.farm.farm_harness import ROOT, farm, wait_done
from tests.farm.test_dashboard import chromium, new_render

SPEC = {"prompt": "a lighthouse in fog", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0,
        "seed": 5, "pack": "tiny"}
LOG = ["12:00:01 INFO farm.worker: task started", "12:00:02 INFO ltx: 8 steps in 0.4 s"]


# Elements reaching past a 390 px screen's right edge, except inside a box that scrolls or clips sideways
# (the tables scroll within their pane; that is the layout, not an overflow).
OVERFLOWING = """[...document.querySelectorAll('body *')].filter((el) => {
  const r = el.getBoundingClientRect();
  if (!r.width || r.right <= 391) return false;
  for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
    if (['auto', 'scroll', 'hidden'].includes(getComputedStyle(p).overflowX)) return false;
  }
  return true;
}).map((el) => el.tagName + '#' + el.id + '.' + el.className + ' ' + el.textContent.slice(0, 30)).slice(0, 8)"""


def live_render(store) -> tuple[str, str]:
    """A render driven through the store: text done with log lines, stage 1 running on studio-1."""
    rid = new_render(store, "r20250101-121500-aaa111")
    text = store.lease("studio-2", ["mlx"], 60_000)
    store.complete(text["id"], "studio-2", text["fence"], {"out": "0" * 64}, {"seconds": 0.4, "log": LOG})
    running = store.lease("studio-1", ["mlx"], 60_000)
    store.heartbeat(running["id"], "studio-1", running["fence"], 60_000, {"phase": "run"})
    return rid, text["id"]


def hover(browser: Browser, selector: str) -> str:
    box = browser.js(f"JSON.stringify(document.querySelector({json.dumps(selector)}).getBoundingClientRect())")
    rect = json.loads(box)
    browser.call("Input.dispatchMouseEvent", type="mouseMoved", x=rect["x"] + rect["width"] / 2,
                 y=rect["y"] + rect["height"] / 2)
    return browser.wait_for("!document.getElementById('tooltip').classList.contains('hidden')"
                            " && document.getElementById('tooltip').textContent")


@pytest.mark.timeout(400)
def test_dashboard_in_a_real_browser(store, tmp_data, tiny_packs, tmp_path):
    binary = chromium()
    with farm(store, tmp_data, tiny_packs, workers=1) as (client, _procs):
        done = wait_done(client, client.submit(dict(SPEC)))["id"]
        fetched = client.fetch_output(done, tmp_path / "fetched.mp4")
    live, text_task = live_render(store)  # after the real worker stopped: nobody leases these fake tasks
    server, port = start_dashboard(store, "127.0.0.1", 0, "sekrit", data_dir=tmp_data)
    url, shots = f"http://127.0.0.1:{port}/", ROOT / "test-artifacts"
    shots.mkdir(exist_ok=True)
    browser = Browser(binary)
    try:
        browser.goto(url)
        browser.wait_for("document.getElementById('session').textContent === 'log in to see the farm'")
        assert "a lighthouse in fog" not in browser.js("document.body.textContent")  # nothing before login
        browser.screenshot(shots / "browser-login.png")
        browser.js("document.getElementById('login-token').value = 'sekrit';"
                   "document.getElementById('login').requestSubmit(); true")
        browser.wait_for("document.getElementById('session').textContent === 'operator'")
        browser.wait_for("document.querySelectorAll('#renders tbody tr').length === 2")
        assert "a lighthouse in fog" in browser.js("document.getElementById('renders').textContent")
        browser.screenshot(shots / "browser-list.png")

        browser.js(f"location.hash = 'render={live}'; true")
        browser.wait_for("!!document.querySelector('#grids [data-state=running]')")
        tip = hover(browser, f'[data-task="{text_task}"]')
        assert "text encoding" in tip and "worker log" in tip and LOG[1] in tip, tip
        browser.screenshot(shots / "browser-running-popover.png")

        browser.js("window.confirm = () => true; true")
        browser.wait_for("!!document.querySelector('#workers button.drain')")
        browser.js("[...document.querySelectorAll('#workers tr')].find(r => r.textContent.includes('mbp-1'))"
                   ".querySelector('button.drain').click(); true")
        browser.wait_for("[...document.querySelectorAll('#workers tr')].some(r => r.textContent.includes('mbp-1')"
                         " && r.textContent.includes('draining'))")
        assert store.worker_draining("mbp-1")
        browser.js("[...document.querySelectorAll('#workers tr')].find(r => r.textContent.includes('mbp-1'))"
                   ".querySelector('button.resume').click(); true")  # resume, beside drain, undoes it
        browser.wait_for("[...document.querySelectorAll('#workers tr')].some(r => r.textContent.includes('mbp-1')"
                         " && !r.textContent.includes('draining') && !!r.querySelector('button.drain'))")
        assert not store.worker_draining("mbp-1")

        browser.js(f"location.hash = 'render={done}'; true")
        browser.wait_for("!!document.querySelector('#video video')")
        played = browser.js("(async () => { const v = document.querySelector('#video video'); v.muted = true;"
                            " await v.play(); await new Promise(r => setTimeout(r, 700)); v.pause();"
                            " return [v.readyState, v.currentTime, v.duration, v.videoWidth]; })()")
        assert played[0] >= 2 and played[1] > 0 and abs(played[2] - 25 / 24) < 0.1 and played[3] == 384, played
        size = browser.js("fetch(document.querySelector('#video a').href).then(r => r.arrayBuffer())"
                          ".then(b => b.byteLength)")
        assert size == Path(fetched).stat().st_size
        browser.screenshot(shots / "browser-video.png")

        browser.js(f"location.hash = 'render={live}'; true")
        browser.wait_for("!!document.querySelector('#grids [data-state=running]')")
        hover(browser, f'[data-task="{text_task}"]')  # a tip placed for the wide window...
        browser.viewport(390, 844, mobile=True)  # ...then a phone: nothing wider than the screen
        browser.screenshot(shots / "browser-narrow-390.png")
        assert browser.js(OVERFLOWING) == [], "wider than a 390 px screen"
        assert browser.js("innerWidth") == 390  # a phone zooms out a page wider than its screen
    finally:
        browser.close()
        stop_dashboard(server)
