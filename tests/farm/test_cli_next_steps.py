"""Messages that name the next step, where no coordinator answers: the unreachable
coordinator, `farm doctor`, `farm ls --state`, `farm submit --pack FOLDER`, and `farm plan --fleet` with
the docs' own FLEET.toml and with a broken one — each through the real `farm` command. Then a
newcomer's first tries in a fresh data folder: `render --local` with no pack yet, a render with no farm
and no token, an `-o` into a missing folder, and refusals that name the flag, the rule and what helps."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.state.redis_server import free_port
from tests.farm.farm_harness import ROOT
from tests.media_files import write_clip, write_wav

CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, tiny_packs: Path) -> Path:
    """A data folder with a token and the tiny pack (as after a `farm up`) but no coordinator running on
    its port."""
    from coordinator.api.auth import load_or_create_token

    folder = tmp_path_factory.mktemp("nocoordinator")
    load_or_create_token(folder)
    (folder / "packs").symlink_to(tiny_packs)
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
    performance = (ROOT / "docs" / "performance.md").read_text()
    example = re.search(r"    # FLEET.toml[^\n]*\n((?:    [^\n]*\n)+?)\n", performance)
    assert example, "docs/performance.md has no FLEET.toml example"
    (tmp_path / "FLEET.toml").write_text("\n".join(line[4:] for line in example[1].splitlines()) + "\n")
    plan = farm(data, "plan", "-p", "a fox", "-H", "1088", "-W", "1920", "-f", "121", "--stage2-tiles", "auto",
                "--fleet", "FLEET.toml", cwd=tmp_path)  # the docs' `farm plan` line
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
    second_mac = (ROOT / "docs" / "getting-started.md").read_text().split("## A second Mac", 1)[1]
    assert "farm coordinator --host 0.0.0.0 --dashboard-host 0.0.0.0" in second_mac


FLEET = '[[workers]]\nname = "studio"\nchip = "M2 Ultra"\nmemory_gb = 192\ncount = 2\n'


@pytest.mark.timeout(300)
def test_render_local_in_a_fresh_data_folder_writes_the_tiny_pack_and_renders(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"  # no token, no packs: a new machine
    bad = farm(fresh, "render", "--local", "-p", "fox", "-H", "250", "-o", str(tmp_path / "x.mp4"))
    assert bad.returncode == 2 and "height 250" in one_line(bad)  # bad input first, in its one line ...
    assert not (fresh / "packs" / "tiny").exists()  # ... and nothing written for it
    done = farm(fresh, "render", "--local", "-p", "fox", "-H", "128", "-W", "128", "-f", "9",
                "-o", str(tmp_path / "x.mp4"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"writing the tiny pack to {fresh / 'packs' / 'tiny'}" in done.stderr, done.stderr[-3000:]
    assert "coloured noise" in done.stderr and (tmp_path / "x.mp4").stat().st_size > 0


@pytest.mark.timeout(60)
def test_no_farm_and_no_token_shows_the_unreachable_line(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(f'coordinator = "127.0.0.1:{free_port()}"\n')  # nothing listens
    render = farm(tmp_path, "render", "-p", "fox")
    line = one_line(render)
    assert render.returncode == 2 and "unreachable" in line and "farm up" in line and "--local" in line, line
    assert "token" not in line, line
    status = farm(tmp_path, "status")
    assert status.returncode == 1 and "start one with `farm up`" in one_line(status), status.stderr


@pytest.mark.timeout(120)
def test_an_output_into_a_missing_folder_is_refused_before_any_work(data: Path, tmp_path: Path) -> None:
    target = tmp_path / "nonexist" / "dir" / "x.mp4"
    for args in (["render", "-p", "x"], ["render", "--local", "-p", "x", "-H", "128", "-W", "128", "-f", "9"],
                 ["fetch", "r1"], ["submit", "-p", "x"]):
        result = farm(data, *args, "-o", str(target))
        line = one_line(result)
        assert result.returncode == 2, (args, result.stderr)
        assert line == (f"farm: -o {target}: there is no folder {target.parent} on this machine: make it first "
                        f"(mkdir -p {target.parent}) or give another path"), (args, line)
    assert not (tmp_path / "nonexist").exists()  # --local made no folder


@pytest.mark.timeout(60)
def test_decode_tiles_refusal_states_the_rule_and_the_smallest_sizes(data: Path, tmp_path: Path) -> None:
    (tmp_path / "fleet.toml").write_text(FLEET)
    plan = ["plan", "-p", "fox", "-H", "256", "-W", "384", "-f", "25", "--fleet", "fleet.toml"]
    for tiles, what in (("9,128,192", "frames 9 is not a multiple of 8"),
                        ("8,128,192", "frames tile 8 is no larger than its overlap 24")):
        refused = farm(data, *plan, "--decode-tiles", tiles, cwd=tmp_path)
        line = one_line(refused)
        assert refused.returncode == 2 and what in line, line
        assert "multiples of 8,32,32 larger than the overlaps 24,64,64 (the smallest: 32,96,96)" in line, line
    smallest = farm(data, *plan, "--decode-tiles", "32,96,96", cwd=tmp_path)
    assert smallest.returncode == 0 and "decode tiles 32,96,96" in smallest.stdout, smallest.stderr


@pytest.mark.timeout(60)
def test_a_negative_audio_start_is_named_by_its_flag(data: Path, tmp_path: Path) -> None:
    (tmp_path / "fleet.toml").write_text(FLEET)
    start = farm(data, "plan", "-p", "fox", "-H", "128", "-W", "192", "-f", "25", "--fleet", "fleet.toml",
                 "--audio", str(write_wav(tmp_path / "tone.wav", seconds=1.0)), "--audio-start", "-1", cwd=tmp_path)
    assert start.returncode == 2 and "--audio-start -1.0 is outside" in one_line(start), start.stderr
    assert "audio_input" not in start.stderr


@pytest.mark.timeout(60)
def test_a_retake_past_a_short_clip_says_what_can_help(data: Path, tmp_path: Path) -> None:
    (tmp_path / "fleet.toml").write_text(FLEET)
    clip = write_clip(tmp_path / "short.mp4", frames=17)  # 0.71 s at 24 fps
    plan = ["plan", "-p", "fox", "-H", "128", "-W", "192", "--fleet", "fleet.toml", "--retake", str(clip)]
    retake = farm(data, *plan, "--start", "0", "--end", "5", cwd=tmp_path)
    line = one_line(retake)  # -f left out: the render is the whole clip, so a larger -f cannot help
    assert retake.returncode == 2 and "give --end 0.7 or less, or a longer clip" in line and "-f" not in line, line
    inside = farm(data, *plan, "--start", "0", "--end", "0.7", cwd=tmp_path)  # what the line said helps
    assert inside.returncode == 0, inside.stderr


@pytest.mark.timeout(120)
def test_a_missing_lora_says_it_was_looked_for_here_and_in_the_pack(data: Path, tmp_path: Path) -> None:
    lora = farm(data, "render", "--local", "-p", "x", "-H", "128", "-W", "128", "-f", "9",
                "--lora", "missing.safetensors", "0.5", "-o", str(tmp_path / "x.mp4"))
    line = one_line(lora)
    assert lora.returncode == 2 and "--lora missing.safetensors: no such file on this machine" in line, line
    assert "nor in the folder of pack 'tiny'" in line, line


@pytest.mark.timeout(60)
def test_plan_for_a_fleet_without_f_says_which_length_it_assumes(data: Path, tmp_path: Path) -> None:
    (tmp_path / "fleet.toml").write_text(FLEET)
    plan = farm(data, "plan", "-p", "fox", "-H", "256", "-W", "384", "--fleet", "fleet.toml", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    first = plan.stdout.splitlines()[0]
    assert "duration head picks it" in first and "assumes 25 frames (1.04 s at 24 fps)" in first, plan.stdout
    assert "384x256x25 on 2 worker(s)" in plan.stdout, plan.stdout
    given = farm(data, "plan", "-p", "fox", "-H", "256", "-W", "384", "-f", "49", "--fleet", "fleet.toml",
                 cwd=tmp_path)
    assert "assumes" not in given.stdout and "384x256x49" in given.stdout, given.stdout
