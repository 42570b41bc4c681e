"""`farm plan` and `farm submit` without -f on an LTX-2.5 pack: the pack's DurationHead picks the length
(README: -f may be left out). Both used to send frames=25, so the head never ran from the CLI; the
spec is now built in one place for render, submit and plan (farm_cli/spec.py), with the spec record's
default (None: the head picks it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ltx_engine.rules.duration import frames_for
from tests.farm.farm_harness import ROOT, farm, wait_done

CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]
ASK = ["-p", "a fox walks through snow", "-H", "64", "-W", "64", "--seed", "3", "--pack", "tiny25",
       "--decode-tiles", "off"]


def _cli(*args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=240, env=env)


def _described(client, pack: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any((w.get("packs") or {}).get(pack) for w in client.workers()):
            return
        time.sleep(0.2)
    raise AssertionError("the worker did not describe its pack")


@pytest.mark.timeout(600)
def test_plan_and_submit_without_frames_let_the_duration_head_pick(store, tmp_data, tmp_path):
    packs = tmp_path / "packs"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FARM_DATA": str(tmp_data)}
    made = _cli("pack", "tiny", str(packs / "tiny25"), "--variant", "2.5", env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr[-2000:]
    with farm(store, tmp_data, packs, workers=1) as (client, _procs):
        env["FARM_TOKEN"] = (tmp_data / "token").read_text().strip()
        _described(client, "tiny25")
        planned = _cli("plan", *ASK, "--coordinator", client.address, env=env, cwd=tmp_path)
        assert planned.returncode == 0, planned.stderr[-2000:]
        assert "length: picked by the pack's DurationHead" in planned.stdout, planned.stdout
        assert "64x64x? on 1 worker(s)" in planned.stdout, planned.stdout
        submitted = _cli("submit", *ASK, "--coordinator", client.address, env=env, cwd=tmp_path)
        assert submitted.returncode == 0, submitted.stderr[-2000:]
        render = wait_done(client, submitted.stdout.strip().splitlines()[-1], timeout=500)
    frames, seconds = render["spec"]["frames"], render["spec"]["predicted_seconds"]
    assert seconds is not None and frames == frames_for(seconds, 24.0), render["spec"]  # the head's pick
    assert any(t["id"].endswith(".length.head") for t in render["tasks"])
