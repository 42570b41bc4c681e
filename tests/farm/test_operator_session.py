"""An operator's session through the real `farm` command: config file -> farm up -> submit --seeds 1-3
--wait -> farm ls -> farm logs -> retry of a cancelled render -> farm fetch GROUP -> farm delete."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordinator.state.redis_server import free_port
from tests.farm.farm_harness import ROOT

CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]


@pytest.mark.timeout(420)
def test_operator_session(tmp_path: Path, tiny_packs: Path) -> None:
    data, work = tmp_path / "data", tmp_path / "work"
    (data / "packs").mkdir(parents=True)
    work.mkdir()
    (data / "packs" / "tiny").symlink_to(tiny_packs / "tiny")
    port = free_port()
    (data / "config.toml").write_text(f'coordinator = "127.0.0.1:{port}"\nuser = "ana@studio"\n'
                                      f'output_dir = "{work / "out"}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")} | {"FARM_DATA": str(data),
                                                                                "PYTHONPATH": str(ROOT)}

    def farm(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=work, env=env, timeout=timeout)

    log = open(tmp_path / "up.log", "w")  # noqa: SIM115 - the farm writes it until it stops
    up = subprocess.Popen([*CLI, "up", "--workers", "2", "--port", str(port), "--dashboard-port", str(free_port())],
                          stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
    try:
        deadline = time.monotonic() + 120
        while "farm up: coordinator" not in (tmp_path / "up.log").read_text():
            assert up.poll() is None and time.monotonic() < deadline, (tmp_path / "up.log").read_text()
            time.sleep(0.3)
        # the batch at the least the session needs (nothing here reads pixels); the cancelled render keeps the
        # default size, so it is still running when `farm cancel` reaches it
        batch = farm("submit", "-p", "a paper boat on a pond", "--seeds", "1-3", "-H", "128", "-W", "192", "-f", "9",
                     "--wait")
        assert batch.returncode == 0, batch.stderr[-3000:]
        group, *ids = batch.stdout.split()
        assert group.startswith("g") and len(ids) == 3 and all(i.startswith("r") for i in ids), batch.stdout

        listed = farm("ls", "--group", group, "--columns", "id,state,by,group,prompt")
        rows = [line for line in listed.stdout.splitlines()[1:] if line.strip()]
        assert len(rows) == 3 and all("done" in r and "ana@studio" in r and group in r for r in rows), listed.stdout
        assert farm("ls", "--state", "failed").stdout.strip().splitlines()[1:] == []

        logs = farm("logs", ids[0], "stage1")
        assert logs.returncode == 0 and f"== {ids[0]}.stage1  done on worker-" in logs.stdout, logs.stdout
        assert "INFO farm.worker: task " in logs.stdout, logs.stdout  # the worker's own lines

        doomed = farm("submit", "-p", "a kite", "--seed", "9").stdout.strip()
        assert farm("cancel", doomed).returncode == 0
        again = farm("retry", doomed)
        assert again.returncode == 0 and again.stdout.strip().startswith("r"), again.stderr
        retried = again.stdout.strip()
        assert retried == doomed and farm("watch", retried).returncode == 0  # in place: its unfinished tasks
        assert farm("retry", retried).returncode == 1  # a done render is not retried

        fetched = farm("fetch", group)
        assert fetched.returncode == 0, fetched.stderr
        files = sorted(p.name for p in (work / "out" / group).glob("*.mp4"))
        assert files == ["seed-1.mp4", "seed-2.mp4", "seed-3.mp4"] and all(
            (work / "out" / group / f).stat().st_size > 1000 for f in files)

        gone = farm("delete", ids[0])
        assert gone.returncode == 0 and f"{ids[0]} deleted" in gone.stdout
        assert ids[0] not in farm("ls").stdout and farm("status", ids[0]).returncode == 1
        assert not (data / "renders" / ids[0]).exists()
    finally:
        up.terminate()
        up.wait(timeout=60)
        log.close()
