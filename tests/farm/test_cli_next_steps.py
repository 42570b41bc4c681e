"""Messages that name the next step, where no coordinator answers (issue #27, item 8): the unreachable
coordinator, `farm doctor`, `farm ls --state`, `farm submit --pack FOLDER`, and `farm plan --fleet` with
README's own FLEET.toml and with a broken one — each through the real `farm` command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.state.redis_server import free_port
from tests.farm.farm_harness import ROOT

CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder with a token (as after a `farm up`) but no coordinator running on its port."""
    from coordinator.auth import load_or_create_token

    folder = tmp_path_factory.mktemp("nocoordinator")
    load_or_create_token(folder)
    (folder / "config.toml").write_text(f'coordinator = "127.0.0.1:{free_port()}"\n')
    return folder


def farm(data: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")} | {"FARM_DATA": str(data),
                                                                                "PYTHONPATH": str(ROOT)}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=60)


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


@pytest.mark.timeout(120)
def test_an_unreachable_coordinator_names_the_next_step(data: Path) -> None:
    status = farm(data, "status")
    assert status.returncode == 1 and "unreachable" in one_line(status) and "start one with `farm up`" in status.stderr
    render = farm(data, "render", "-p", "a fox", "-H", "256", "-W", "384", "-f", "25")
    line = one_line(render)
    assert render.returncode == 2 and "start one with `farm up`" in line and "render here with --local" in line, line
    doctor = farm(data, "doctor")
    assert "<lambda>" not in doctor.stdout and "_Refused" not in doctor.stdout and "Traceback" not in doctor.stderr
    assert "start one with `farm up`" in doctor.stdout, doctor.stdout


@pytest.mark.timeout(60)
def test_bad_filters_and_local_folders_are_refused_before_anything_is_asked(data: Path, tiny_packs: Path) -> None:
    bogus = farm(data, "ls", "--state", "bogus")
    assert bogus.returncode == 2 and "--state 'bogus': choose from queued, running" in one_line(bogus)
    folder = farm(data, "submit", "-p", "x", "--pack", str(tiny_packs / "tiny"))
    line = one_line(folder)
    assert folder.returncode == 2 and "cannot see" in line and "--pack tiny" in line and "--local" in line, line


@pytest.mark.timeout(60)
def test_plan_reads_the_readme_fleet_and_refuses_a_broken_one_in_one_line(data: Path, tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    example = re.search(r"    # FLEET.toml[^\n]*\n((?:    [^\n]*\n)+?)\n", readme)
    assert example, "README has no FLEET.toml example"
    (tmp_path / "FLEET.toml").write_text("\n".join(line[4:] for line in example[1].splitlines()) + "\n")
    plan = farm(data, "plan", "-p", "a fox", "-H", "1088", "-W", "1920", "-f", "121", "--stage2-tiles", "auto",
                "--fleet", "FLEET.toml", cwd=tmp_path)  # README's `farm plan` line
    assert plan.returncode == 0, plan.stderr
    assert "on 3 worker(s)" in plan.stdout and "predicted wall time" in plan.stdout, plan.stdout
    assert re.search(r"decode tiles \S+ \(\d+ tiles\)", plan.stdout), plan.stdout  # tiled here: it says so
    (tmp_path / "bad.toml").write_text('[[workers]]\nname = "studio"; chip = "M1 Max"\n')  # the old example
    bad = farm(data, "plan", "-p", "a fox", "--fleet", "bad.toml", cwd=tmp_path)
    assert bad.returncode == 2 and "--fleet bad.toml: not a fleet file" in one_line(bad), bad.stderr
    gone = farm(data, "plan", "-p", "a fox", "--fleet", "missing.toml", cwd=tmp_path)
    assert gone.returncode == 2 and "missing.toml" in one_line(gone), gone.stderr


def test_readme_puts_farm_on_path_and_opens_the_dashboard_with_the_coordinator() -> None:
    readme = (ROOT / "README.md").read_text()
    using = readme.split("## Using it", 1)[1]
    assert "source .venv/bin/activate" in using.split("farm up")[0]  # before the first `farm` command
    assert "farm coordinator --host 0.0.0.0 --dashboard-host 0.0.0.0" in using
