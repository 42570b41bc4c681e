"""The film grows while it renders, on a real farm: a 3-window chunked render (the chunk farm module's
tiny spec, stage 2 untiled) whose first worker may run only the tasks before window 2 (`--max-tasks`: nothing of window 2
is ready before window 1's carry, so it stops there whatever the timing). Held there, `farm fetch --partial`
returns a playable mp4 of windows 0 and 1's finished frames while a plain fetch still says "no output
yet"; the coordinator restarts and resumes at the window it reached (no window's task or segment made
again); a second worker then finishes it, and the render's mp4 is `farm render --local`'s, bit for bit. The
partial is, bit for bit, the film grown from `--local`'s outputs, and off the frames the assembler writes by
the codec's rounding alone (as the final mp4 is: two encodes of the same frames are not the same bits)."""

from __future__ import annotations

import subprocess
import sys

import av
import numpy as np
import pytest

from coordinator.assemble.assembler import video_frames
from coordinator.assemble.partial import PARTIAL_FILE, film_held, grow_film, segment_path
from coordinator.assemble.previews import to_uint8
from coordinator.server import serve, stop
from farm_cli.client import FarmClient
from farm_cli.local import render_local
from ltx_engine.rules.chunks import ChunkLayout
from tests.farm.farm_harness import ROOT, ModuleFarm, join_token, wait_done, wait_until

SPEC = {"prompt": "a fox", "height": 64, "width": 128, "frames": 33, "seed": 5, "pack": "tiny", "chunked": True,
        "chunk_pixel_frames": 17, "chunk_carry_frames": 9, "decode_tiles": "32,96,96"}  # the film reads decode tiles
CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]


class Coordinator:
    """The module's coordinator, which a test may restart on the same Redis and data folder."""

    def __init__(self, store, data, packs) -> None:
        from coordinator.api.auth import load_or_create_token

        self.store, self.data, self.packs = store, data, packs
        self.secret = load_or_create_token(data)
        self.server = self.farm = None
        self.start()

    def start(self) -> None:
        self.server, port = serve(self.store, self.data, "127.0.0.1", 0, self.secret, expiry_interval_s=0.2)
        self.address = f"127.0.0.1:{port}"
        self.farm = ModuleFarm(FarmClient(self.address, self.secret, timeout=30), {}, self.data, self.packs)

    def stop(self) -> None:
        self.farm.client.close()
        stop(self.server)

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "FARM_TOKEN": join_token(self.data, self.secret)}
        return subprocess.run([*CLI, *args, "--coordinator", self.address], capture_output=True, text=True,
                              cwd=ROOT, timeout=60, env=env)


@pytest.fixture(scope="module")
def film_farm(mstore, tiny_packs, tmp_path_factory):
    coordinator = Coordinator(mstore, tmp_path_factory.mktemp("film-farm"), tiny_packs)
    workers: dict = {}
    try:
        yield coordinator, workers
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.terminate()
            proc.wait(timeout=20)
        coordinator.stop()


def _before_window_2(tasks: list[dict], render_id: str) -> int:
    """The worker tasks not downstream of window 1's carry: every one before window 2 can start."""
    deps = {t["id"]: set(t.get("deps") or []) for t in tasks}
    later = {f"{render_id}.w1.carry"}
    while grown := {tid for tid, ds in deps.items() if ds & later} - later:
        later |= grown
    return sum(t.get("capability") != "coordinator" and t["id"] not in later for t in tasks)


def _frames(path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _frame_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got.astype(int) - want[: got.shape[0]].astype(int)).mean(axis=(1, 2, 3))


@pytest.mark.timeout(420)
def test_a_fetch_mid_render_returns_the_finished_windows_and_a_restart_resumes_at_them(film_farm, local_runner,
                                                                                      tmp_path):
    coordinator, workers = film_farm
    render_id = coordinator.farm.client.submit(dict(SPEC))
    first = _before_window_2(coordinator.farm.client.get(render_id)["tasks"], render_id)
    early = coordinator.cli("fetch", render_id, "--partial", "-o", str(tmp_path / "none.mp4"))
    assert early.returncode == 1 and early.stderr.strip().endswith("no window of it is finished yet"), early.stderr
    plain_id = coordinator.farm.client.submit({k: v for k, v in SPEC.items() if not k.startswith("chunk")} | {"frames": 9})
    unchunked = coordinator.cli("fetch", plain_id, "--partial", "-o", str(tmp_path / "none.mp4"))
    assert unchunked.returncode == 1 and "is not --chunked" in unchunked.stderr, unchunked.stderr
    assert coordinator.farm.client.cancel(plain_id) and not (tmp_path / "none.mp4").exists()
    workers["w1"] = coordinator.farm.start("w1", "--max-tasks", str(first))
    assert workers["w1"].wait(timeout=300) == 0  # windows 0 and 1 rendered; window 2 waits for a worker
    out = coordinator.data / "renders" / render_id
    wait_until(lambda: film_held(out) == 2, 60, "the film holding windows 0 and 1")
    segments = {k: segment_path(out, k).stat().st_mtime_ns for k in (0, 1)}

    plain = coordinator.cli("fetch", render_id, "-o", str(tmp_path / "early.mp4"))
    assert plain.returncode == 1 and "no output yet" in plain.stderr, plain.stderr
    fetched = coordinator.cli("fetch", render_id, "--partial", "-o", str(tmp_path / "partial.mp4"))
    assert fetched.returncode == 0, fetched.stderr
    partial = _frames(tmp_path / "partial.mp4")
    assert partial.shape[0] == ChunkLayout(33, 17, 9, 8).final_frames(2) == 17  # window 1's seam with 2 waits

    coordinator.stop()  # a restart mid-render: the film and the render resume at window 2
    coordinator.start()
    published = (out / PARTIAL_FILE).stat().st_mtime_ns
    again = coordinator.cli("fetch", render_id, "--partial", "-o", str(tmp_path / "again.mp4"))
    assert again.returncode == 0 and np.array_equal(_frames(tmp_path / "again.mp4"), partial), again.stderr
    workers["w2"] = coordinator.farm.start("w2")
    render = wait_done(coordinator.farm.client, render_id, timeout=300)
    by_worker = {t["id"].removeprefix(f"{render_id}."): t.get("worker") for t in render["tasks"]}
    assert {w for name, w in by_worker.items() if name.startswith(("w0.", "w1.")) and w != "coordinator"} == {"w1"}
    assert {w for name, w in by_worker.items() if name.startswith("w2.") and w != "coordinator"} == {"w2"}
    assert {k: segment_path(out, k).stat().st_mtime_ns for k in (0, 1)} == segments
    assert (out / PARTIAL_FILE).stat().st_mtime_ns == published or film_held(out) == 3  # only window 2 added

    local, outputs, blobs = render_local(dict(SPEC), tmp_path / "local.mp4", local_runner)
    final = _frames(out / "render.mp4")
    np.testing.assert_array_equal(final, _frames(local))  # the render itself: --local's, bit for bit

    def get(name: str, output: str) -> np.ndarray | None:  # as `render --local` hands its outputs to the assembler
        sha = outputs.get(f"local.{name}", {}).get(output)
        return None if sha is None else blobs.get(sha)

    assert grow_film(render["spec"], get, tmp_path / "local-film", 2) == 2  # --local's outputs, as the film grows
    np.testing.assert_array_equal(partial, _frames(tmp_path / "local-film" / PARTIAL_FILE))
    raw = np.stack([to_uint8(f) for f in video_frames(render["spec"], get)[0]])  # the frames the assembler wrote
    film, whole = _frame_error(partial, raw), _frame_error(final[:17], raw)  # the tiny pack's frames are noise:
    assert film.mean() < 1.5 * whole.mean(), (film, whole)  # each mp4 off them by its codec's rounding alone
