"""The film grows while it renders, without a farm: which frames of a chunked clip are final after each
window, each window's share of the joined clip, the growing partial.mp4 (and a restart that resumes it at
the window it reached), and the windows' row `farm watch` and the dashboard show."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
from rich.console import Console

from coordinator.assemble.assembler import assemble_streaming
from coordinator.assemble.chunk_frames import joined_frames, window_share
from coordinator.assemble.partial import PARTIAL_FILE, PARTIAL_META, film_held, grow_film, segment_path
from coordinator.assemble.previews import to_uint8
from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from coordinator.views.windows import decoded_windows, window_rows, windows_line
from farm_cli.watch_view import WatchState, render_view
from ltx_engine.rules.chunks import ChunkLayout

pytestmark = pytest.mark.timeout(120)

SPEC = {"prompt": "a fox", "height": 64, "width": 128, "frames": 33, "seed": 3, "pack": "tiny", "chunked": True,
        "chunk_pixel_frames": 17, "chunk_carry_frames": 9, "decode_tiles": "off"}


def _stored() -> dict:
    return validate_spec(normalize_spec(dict(SPEC)), []).as_dict()


def _decodes() -> dict[str, np.ndarray]:
    """Each window's decoded frames: smooth gradients (what a codec keeps close), a little different per
    window and per frame, so a seam's crossfade and a frame out of place both show."""
    y, x = np.mgrid[0:64, 0:128].astype(np.float32)
    out = {}
    for k in range(3):
        frames = [np.stack([x / 127, y / 63, np.full_like(x, (k * 17 + j) * 23 % 200 / 255)], axis=-1) for j in range(17)]
        out[f"w{k}.decode"] = np.stack(frames).astype(np.float32)
    return out


def _getter(decodes: dict[str, np.ndarray]):
    return lambda name, output: decodes.get(name) if output == "frames" else None


def _mp4_frames(path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _frame_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Each frame's mean absolute difference (8-bit levels) from the same frame of `want`."""
    return np.abs(got.astype(int) - want[: got.shape[0]].astype(int)).mean(axis=(1, 2, 3))


def test_a_windows_frames_are_final_up_to_the_next_seams_crossfade():
    lay = ChunkLayout(33, 17, 9, 8)  # windows [0, 17), [8, 25), [16, 33); each seam's 8 frames before 17, 25
    assert [lay.final_frames(n) for n in range(5)] == [0, 9, 17, 33, 33]
    assert ChunkLayout(169).final_frames(1) == 97 - 8  # upstream's 97 / 25, our blend of 8


def test_the_windows_shares_are_the_joined_clip_cut_at_the_final_frames():
    plan, decodes = validate_spec(normalize_spec(dict(SPEC)), []), _decodes()
    frames = lambda view, prefix: (iter(decodes[prefix + "decode"]), {})  # noqa: E731
    joined = np.stack(list(joined_frames(plan, frames)[0]))
    lay = ChunkLayout(33, 17, 9, 8)
    for k in range(3):
        share = np.stack(list(window_share(plan, frames, k)))
        np.testing.assert_array_equal(share, joined[lay.final_frames(k):lay.final_frames(k + 1)])


def test_the_film_grows_window_by_window_resumes_where_it_was_and_ends_as_the_render(tmp_path):
    spec, decodes = _stored(), _decodes()
    get = _getter(decodes)
    final = assemble_streaming(spec, get, tmp_path / "final")  # the assembler's own mp4 of the whole clip
    want = _mp4_frames(final)
    plan = validate_spec(normalize_spec(dict(SPEC)), [])
    raw = np.stack([to_uint8(f) for f in joined_frames(plan, lambda v, p: (iter(decodes[p + "decode"]), {}))[0]])
    out = tmp_path / "film"
    assert grow_film(spec, get, out, 1) == 1
    first = _mp4_frames(out / PARTIAL_FILE)
    assert first.shape[0] == 9 and film_held(out) == 1
    made = segment_path(out, 0).stat().st_mtime_ns
    # a coordinator that restarts finds the segments on disk: only window 1's is written, the film republished
    assert grow_film(spec, get, out, 2) == 2 and segment_path(out, 0).stat().st_mtime_ns == made
    published = (out / PARTIAL_FILE).stat().st_mtime_ns
    assert grow_film(spec, get, out, 2) == 2 and (out / PARTIAL_FILE).stat().st_mtime_ns == published  # nothing new
    assert grow_film(spec, get, out, 3) == 3
    film = _mp4_frames(out / PARTIAL_FILE)
    assert film.shape == want.shape == raw.shape == (33, 64, 128, 3)
    for got in (film, first):  # the same frames as the render's, each within the codec's rounding
        assert _frame_error(got, raw).max() < 3 and _frame_error(got, want).max() < 3
    assert (out / PARTIAL_META).read_text() == '{"windows": 3, "frames": 33}'


def _render(states: dict[str, str]) -> tuple[dict, list[dict]]:
    """A planned 3-window render whose tasks are done, leased or waiting as `states` says by name prefix."""
    plan = validate_spec(normalize_spec(dict(SPEC)), [])
    tasks = plan_render(plan, "r")
    for t in tasks:
        name = t["id"].removeprefix("r.")
        t["state"] = next((s for prefix, s in states.items() if name.startswith(prefix)), "waiting")
    return {"id": "r", "spec": plan.as_dict()}, tasks


def test_the_windows_row_says_each_windows_state_and_frames():
    render, tasks = _render({"w0.": "done", "w1.stage1": "done", "w1.stage2": "leased", "text": "done"})
    rows = window_rows(render, tasks)
    assert rows == [{"index": 0, "state": "done", "frames": [0, 17]},
                    {"index": 1, "state": "rendering", "frames": [8, 25]},
                    {"index": 2, "state": "waiting", "frames": [16, 33]}]
    assert decoded_windows(rows) == 1
    assert windows_line(rows) == "windows  0 done 0–17 · 1 rendering 8–25 · 2 waiting 16–33"
    render, tasks = _render({"w0.": "done", "w1.": "done", "w2.decode": "queued", "w2.": "done"})
    assert [r["state"] for r in window_rows(render, tasks)] == ["done", "done", "rendering"]
    assert window_rows({"id": "x", "spec": {**render["spec"], "chunked": False}}, tasks) == []


def test_farm_watch_shows_the_windows_row():
    render, tasks = _render({"w0.": "done", "w1.stage1": "leased", "text": "done"})
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(render_view(WatchState({**render, "state": "running", "tasks": tasks})))
    assert "windows  0 done 0–17 · 1 rendering 8–25 · 2 waiting 16–33" in console.file.getvalue()
