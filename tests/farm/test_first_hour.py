"""A newcomer's first hour, as one script: a fresh HOME (no farm folder, no token, no pack), then the
commands the README leads them through, in the order they meet them, each checked for its exit code
and its words. What a newcomer sees first is what this guards: a wall here is a wall for everyone.

The farm's address comes from FARM_COORDINATOR only because the default ports may be taken on a
shared test machine; every command is otherwise typed as the README shows it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordinator.state.redis_server import free_port
from tests.farm.farm_harness import ROOT

FARM = [sys.executable, "-c", "from farm_cli.main import main; main()"]
SMALL = ["-H", "128", "-W", "128", "-f", "9", "--seed", "3"]  # the tiny pack's smallest everyday clip


class Newcomer:
    """Runs `farm …` as a user with a fresh HOME would, in a folder of their own."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.home, self.cwd = tmp / "home", tmp / "work"
        self.home.mkdir()
        self.cwd.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
        self.env = {**env, "HOME": str(self.home), "PYTHONPATH": str(ROOT), "FARM_ANNOUNCE": "0",
                    "FARM_COORDINATOR": f"127.0.0.1:{port}"}

    def farm(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        return subprocess.run([*FARM, *args], capture_output=True, text=True, timeout=timeout, env=self.env,
                              cwd=self.cwd)

    def start(self, *args: str, log: Path) -> subprocess.Popen:
        with open(log, "ab") as out:
            return subprocess.Popen([*FARM, *args], stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd)


def _one_line(result: subprocess.CompletedProcess) -> str:
    """The one line a refusal prints (and never a traceback)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stdout


def _before_any_farm(me: Newcomer) -> None:
    """What the README's first command tries before `farm up` ever ran: no pack, no farm, no token."""
    local = me.farm("render", "--local", "-p", "a fox in the snow", *SMALL, "-o", "ref.mp4")
    assert local.returncode == 0, local.stderr[-2000:]  # the tiny pack written as `farm up` writes it
    assert "writing the tiny pack" in local.stderr and "coloured noise" in local.stderr
    assert (me.cwd / "ref.mp4").stat().st_size > 0

    remote = me.farm("render", "-p", "a fox in the snow", *SMALL)  # no farm yet, so no token either
    line = _one_line(remote)
    assert remote.returncode == 2 and "nothing listens there" in line, line
    assert "farm up" in line and "--local" in line, line


def _up_started(me: Newcomer, up: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + 120
    while "farm up: coordinator" not in log.read_text():
        assert up.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    text = log.read_text()
    assert "writing the tiny pack" not in text  # the one --local wrote is the farm's
    assert (me.home / ".ltx-farm" / "packs" / "tiny" / "config.json").is_file()
    assert f"farm up: coordinator 127.0.0.1:{port}, 1 workers; token in {me.home / '.ltx-farm' / 'token'}" in text
    assert "(this link logs in)" in text


def _render_submit_watch_fetch(me: Newcomer) -> None:
    """The reference in this process, the same clip through the farm, and the two byte for byte equal."""
    assert "wrote ref.mp4" in _ok(me.farm("render", "--local", "-p", "a fox in the snow", *SMALL, "-o", "ref.mp4"))
    render_id = _ok(me.farm("submit", "-p", "a fox in the snow", *SMALL)).strip()
    assert render_id.startswith("r"), render_id

    watched = _ok(me.farm("watch", render_id))
    assert f"{render_id} done" in watched
    assert f"farm fetch {render_id} -o {render_id}.mp4" in watched  # the next step, spelled out

    assert "wrote fox.mp4" in _ok(me.farm("fetch", render_id, "-o", "fox.mp4"))
    assert (me.cwd / "fox.mp4").read_bytes() == (me.cwd / "ref.mp4").read_bytes()
    assert render_id in _ok(me.farm("ls"))

    bad = me.farm("fetch", render_id, "-o", str(me.cwd / "no-such-folder" / "fox.mp4"))
    assert bad.returncode == 2 and "there is no folder" in _one_line(bad) and "mkdir -p" in _one_line(bad)
    assert "Traceback" not in bad.stderr and not (me.cwd / "no-such-folder").exists()


def _cancel(me: Newcomer) -> None:
    render_id = _ok(me.farm("submit", "-p", "a fox that changes its mind", "-H", "128", "-W", "128", "-f", "25")).strip()
    assert _ok(me.farm("cancel", render_id)).strip() == f"{render_id} cancelled"
    watched = me.farm("watch", render_id)
    assert watched.returncode == 1 and f"{render_id} cancelled" in watched.stdout
    assert _ok(me.farm("status", render_id)).splitlines()[0].split() == [render_id, "cancelled"]
    nothing = me.farm("fetch", render_id, "-o", "cancelled.mp4")
    assert nothing.returncode == 1
    assert f"render {render_id} was cancelled: it has no output" in nothing.stderr
    assert "Traceback" not in nothing.stderr and not (me.cwd / "cancelled.mp4").exists()


@pytest.mark.timeout(600)
def test_first_hour_in_a_fresh_home(tmp_path: Path) -> None:
    port = free_port()
    me = Newcomer(tmp_path, port)
    _before_any_farm(me)
    log = tmp_path / "up.log"
    up = me.start("up", "--workers", "1", "--port", str(port), "--dashboard-port", str(free_port()), log=log)
    try:  # whatever fails, farm up is stopped (its worker and Redis with it)
        _up_started(me, up, port, log)
        _render_submit_watch_fetch(me)
        _cancel(me)
    finally:
        up.send_signal(signal.SIGINT)  # Ctrl-C, as the README says
        try:
            code = up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            raise
    assert code == 0 and "farm up: stopping" in log.read_text(), log.read_text()[-3000:]
