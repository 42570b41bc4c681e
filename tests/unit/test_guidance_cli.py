"""The guided recipes' flags through the real CLI: `farm plan` shows passes per step; bad input is one
line, exit 2 (refused before anything is sent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_plan_cli import FLEET

pytestmark = pytest.mark.timeout(150)


def _farm(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "fleet.toml").write_text(FLEET)
    code = "from farm_cli.main import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={"FARM_DATA": str(tmp_path), "PATH": "/usr/bin:/bin"})


def test_plan_shows_the_guided_passes_per_step(tmp_path: Path) -> None:
    result = _farm(tmp_path, "plan", "-p", "fox", "--fleet", str(tmp_path / "fleet.toml"), "-H", "512", "-W", "768",
                   "-f", "49", "--pipeline", "one-stage", "--steps", "30")
    assert result.returncode == 0, result.stderr
    assert ("guidance: 30 steps x 4 passes (cond, uncond, perturbed, isolated) = 4 forwards per step"
            in result.stdout)
    assert "guidance_pass" in result.stdout and "denoise_stage1" not in result.stdout


def test_plan_counts_the_passes_of_skip_steps_and_a_schedule(tmp_path: Path) -> None:
    """4 steps (sigmas 1.0, 0.87, 0.63, 0.1), video CFG off below 0.7 (the audio's still asks for the uncond
    pass); the audio skips steps 1 and 3, where the video's passes run alone: four, except step 3's three."""
    result = _farm(tmp_path, "plan", "-p", "fox", "--fleet", str(tmp_path / "fleet.toml"), "-H", "512", "-W", "768",
                   "-f", "49", "--pipeline", "one-stage", "--steps", "4", "--audio-skip-step", "1",
                   "--guidance-schedule", "1.0:cfg_scale=4;0.7:cfg_scale=1")
    assert result.returncode == 0, result.stderr
    assert "skip steps / --guidance-schedule: 15 pass tasks over 4 rounds (4+4+4+3)" in result.stdout, result.stdout


@pytest.mark.parametrize("args,line", [
    (["--negative-prompt", "blurry"], "--negative-prompt does not apply to the distilled recipe"),
    (["--pipeline", "one-stage", "--cfg-scale", "nan"], "cfg_scale nan is not a finite number"),
    (["--pipeline", "one-stage", "--stg-scale", "-2"], "stg_scale -2.0 is outside [0.0, 100.0]"),
    (["--pipeline", "one-stage", "--steps", "0"], "steps 0 is outside 1..200"),
    (["--pipeline", "one-stage", "--stg-blocks", "99"], "--stg-blocks 99: outside the model's 48 blocks"),
    (["--pipeline", "one-stage", "--modality-blocks", "0,50"], "--modality-blocks 50: outside the model's 48 blocks"),
    (["--pipeline", "one-stage", "--modality-blocks", "1,1"], "modality_blocks [1, 1] names a block twice"),
    (["--pipeline", "one-stage", "--modality-blocks", "2", "--modality-scale", "1", "--audio-modality-scale", "1"],
     "--modality-blocks needs a modality scale other than 1"),
    (["--pipeline", "two-stage-hq", "--steps", "5000"], "steps 5000 is outside 1..200"),
    (["--pipeline", "two-stage", "--stage2-steps", "4"], "--stage2-steps 4: stage 2's sigma table has 3 steps"),
    (["--pipeline", "one-stage", "--stage2-steps", "2"], "--stage2-steps does not apply to the one-stage recipe (--pipeline one-stage); it applies to: two-stage, two-stage-hq"),
    (["--stage1-steps", "4"], "--stage1-steps does not apply to the distilled recipe"),
])
def test_bad_guidance_input_is_one_line_exit_2(tmp_path: Path, args: list[str], line: str) -> None:
    result = _farm(tmp_path, "plan", "-p", "fox", "--fleet", str(tmp_path / "fleet.toml"), *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    err = result.stderr.strip()
    assert line in err and len(err.splitlines()) == 1


def test_plan_shows_hq_passes_per_step(tmp_path: Path) -> None:
    result = _farm(tmp_path, "plan", "-p", "fox", "--fleet", str(tmp_path / "fleet.toml"), "-H", "512", "-W", "768",
                   "-f", "49", "--pipeline", "two-stage-hq", "--stage1-steps", "15", "--stage2-steps", "3")
    assert result.returncode == 0, result.stderr
    assert "guidance: 15 steps x 2 evaluations x 3 passes (cond, uncond, isolated) = 6 forwards per step" in result.stdout
    assert "stage 2: 3 steps x 2 evaluations x 1 pass (cond) + the final evaluation on dev + distilled LoRA 0.5" in (
        result.stdout)


def test_cost_model_predicts_a_4_pass_step_on_4_macs(tmp_path: Path) -> None:
    """Each pass costs one forward over the stage's tokens; 4 Macs take a step's 4 passes at once."""
    import json

    from coordinator.plan.costs import dit_forward_s

    totals = {}
    for count in (1, 4):
        fleet = tmp_path / f"fleet{count}.toml"
        fleet.write_text(f'[[workers]]\nname = "m4pro"\nchip = "Apple M4 Pro"\nmemory_gb = 64\ncount = {count}\n')
        result = _farm(tmp_path, "plan", "-p", "fox", "--fleet", str(fleet), "-H", "512", "-W", "768", "-f", "49",
                       "--pipeline", "one-stage", "--json")
        assert result.returncode == 0, result.stderr
        plan = json.loads(result.stdout)
        stage1 = next(row for row in plan["stages"] if row["stage"] == "stage1")
        assert stage1["kinds"]["guidance_pass"] == 120 and stage1["kinds"]["guide_step"] == 30
        totals[count] = stage1["end_s"] - stage1["start_s"]
        if count == 4:
            assert len([w for w in stage1["workers"] if w.startswith("m4pro")]) == 4
    tokens = 7 * 16 * 24
    assert totals[1] == pytest.approx(120 * dit_forward_s(tokens) + 30 * 0.1 + 0.5, rel=0.02)
    assert totals[1] / totals[4] > 3.5


def test_bench_step_seconds_reads_a_renders_events() -> None:
    """The bench's per-step wall: first pass leased to the step's guide step done (the last guide step
    carries the stage's name); combine and transfer seconds summed."""
    from farm_cli.bench.guidance import step_seconds

    rid = "r1"
    events = [
        {"type": "task_leased", "task": "r1.stage1.prep", "ts": 0},
        {"type": "task_leased", "task": "r1.stage1.s0.cond", "ts": 1000},
        {"type": "task_leased", "task": "r1.stage1.s0.uncond", "ts": 1100},
        {"type": "task_done", "task": "r1.stage1.s0.cond", "ts": 2000, "metrics": {"fetch_s": 0.1, "upload_s": 0.1}},
        {"type": "task_done", "task": "r1.stage1.s0.uncond", "ts": 2100, "metrics": {"fetch_s": 0.1}},
        {"type": "task_leased", "task": "r1.stage1.s0", "ts": 2150},
        {"type": "task_done", "task": "r1.stage1.s0", "ts": 2200},
        {"type": "task_leased", "task": "r1.stage1.s1.cond", "ts": 2300},
        {"type": "task_done", "task": "r1.stage1.s1.cond", "ts": 3300},
        {"type": "task_leased", "task": "r1.stage1", "ts": 3350},
        {"type": "task_done", "task": "r1.stage1", "ts": 3400},
        {"type": "task_done", "task": "r1.decode", "ts": 5000},
    ]
    walls, combine, transfer = step_seconds(events, rid, steps=2)
    assert walls == [pytest.approx(1.2), pytest.approx(1.1)]
    assert combine == pytest.approx(0.1) and transfer == pytest.approx(0.3)
