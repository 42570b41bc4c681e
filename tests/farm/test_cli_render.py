"""`farm render` on a real farm (no --local), with a relative `--exr`, then what `farm status ID`, a
piped `farm watch` and `farm cancel` say about the finished render."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.farm.farm_harness import ROOT, farm

CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]


@pytest.mark.timeout(300)
def test_render_on_the_farm_then_status_watch_and_cancel(store, tmp_data, tiny_packs, tmp_path):
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    with farm(store, tmp_data, tiny_packs, workers=1) as (client, _procs):
        token = (tmp_data / "token").read_text().strip()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "FARM_DATA": str(tmp_data), "FARM_TOKEN": token}

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([*CLI, *args, "--coordinator", client.address],
                                  capture_output=True, text=True, cwd=user_dir, timeout=240, env=env)

        made = run("render", "-p", "a lighthouse in fog", "-H", "256", "-W", "384", "-f", "25", "--seed", "4",
                   "--exr", "frames", "-o", "clip.mp4")
        assert made.returncode == 0, made.stderr[-3000:]
        render_id = made.stdout.strip().splitlines()[0]
        assert (user_dir / "clip.mp4").stat().st_size > 1000
        assert len(list((user_dir / "frames").glob("*.exr"))) == 25  # the user's folder, not the farm's
        assert "None" not in made.stderr, made.stderr  # piped progress: no "step None/None"
        details = run("status", render_id).stdout
        for part in ("a lighthouse in fog", "256x384", "seed 4", "took", "Stage 1", "Decode", "output"):
            assert part in details, (part, details)
        watched = run("watch", render_id)
        assert watched.returncode == 0 and f"{render_id} done" in watched.stdout, watched.stderr
        assert "None" not in watched.stderr and "task_done decode" in watched.stderr, watched.stderr
        cancelled = run("cancel", render_id)
        assert cancelled.returncode == 1 and cancelled.stderr.strip() == \
            f"farm: render {render_id} is done: nothing to cancel", cancelled.stderr
