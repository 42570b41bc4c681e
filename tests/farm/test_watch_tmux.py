"""`farm watch` in a real terminal (tmux) follows a tiled render from start to end."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.farm.farm_harness import ROOT, farm
from tests.needs import require_program

SPEC = {"prompt": "a fox", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 7, "pack": "tiny",
        "stage2_tiles": "2x2", "tile_overlap": 5}


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=30, check=True).stdout


@pytest.mark.timeout(300)
def test_farm_watch_shows_every_stage_done(store, tmp_data, tiny_packs):
    require_program("tmux")
    session = f"farmwatch{os.getpid()}"
    with farm(store, tmp_data, tiny_packs, workers=2) as (client, _procs):
        render_id = client.submit(dict(SPEC))
        done_file = tmp_data / "watch.rc"
        command = (f"cd {ROOT} && {sys.executable} -c 'from farm_cli.main import main; main()' watch {render_id} "
                   f"--coordinator {client.address} --token-file {tmp_data / 'token'}; echo $? > {done_file}; sleep 60")
        _tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "60", command)
        try:
            deadline = time.monotonic() + 240
            while not done_file.exists() and time.monotonic() < deadline:
                time.sleep(0.5)
            screen = _tmux("capture-pane", "-p", "-t", session)
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=30)
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    (ROOT / "test-artifacts" / "farm-watch.txt").write_text(screen)
    assert done_file.read_text().strip() == "0", screen
    assert render_id in screen and "done" in screen, screen
    for stage in ("Text", "Stage 1", "Upsample", "Stage 2", "Decode", "Audio", "Mux"):
        assert stage in screen, screen
