"""`farm plan --fleet FILE` through the real CLI: the plan's structure, memory placement, refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FLEET = """
[[workers]]
name = "m1max"
chip = "Apple M1 Max"
memory_gb = 64

[[workers]]
name = "m2pro"
chip = "Apple M2 Pro"
memory_gb = 32
count = 2
"""


def _plan(tmp_path: Path, *args: str, fleet: str = FLEET) -> subprocess.CompletedProcess:
    (tmp_path / "fleet.toml").write_text(fleet)
    code = "from farm_cli.main import main; main()"
    return subprocess.run([sys.executable, "-c", code, "plan", "-p", "fox", "--fleet", str(tmp_path / "fleet.toml"),
                           *args], capture_output=True, text=True, timeout=120,
                          env={"FARM_DATA": str(tmp_path), "PATH": "/usr/bin:/bin"})


@pytest.mark.timeout(150)
def test_plan_lists_stages_tiles_workers_and_predictions(tmp_path: Path) -> None:
    result = _plan(tmp_path, "-H", "1088", "-W", "1920", "-f", "121", "--stage2-tiles", "2x2", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    stages = [row["stage"] for row in plan["stages"]]
    assert stages[:4] == ["text", "stage1", "upsample", "stage2"] and "decode" in stages
    assert [w["name"] for w in plan["workers"]] == ["m1max", "m2pro#1", "m2pro#2"]
    stage2 = plan["stages"][3]
    assert stage2["kinds"]["transformer_forward"] == 2 * 4  # TDP's 2 steps × 4 tiles
    # Its 32 GB cannot hold a tile's ~30 GiB resident peak: it takes tiles streamed (blocks from disk).
    assert stage2["workers"].get("m2pro#1") and stage2["streamed"]["m2pro#1"] == stage2["workers"]["m2pro#1"]
    assert "m1max" not in stage2["streamed"]
    assert stage2["peak_bytes"] > 24 * 2**30
    ends = [row["end_s"] for row in plan["stages"]]
    assert plan["total_s"] == pytest.approx(max(ends)) and all(e > 0 for e in ends)
    text = _plan(tmp_path, "-H", "576", "-W", "1024", "-f", "121")
    assert text.returncode == 0 and "predicted wall time" in text.stdout and "Stage 2" in text.stdout


@pytest.mark.timeout(150)
def test_plan_refuses_a_render_no_worker_can_hold_with_the_numbers(tmp_path: Path) -> None:
    small = '[[workers]]\nname = "mini"\nchip = "Apple M4"\nmemory_gb = 16\n'
    result = _plan(tmp_path, "-H", "1088", "-W", "1920", "-f", "121", fleet=small)
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "GiB at its peak" in line and "12.0 of its 16.0 GiB" in line and len(line.splitlines()) == 1


@pytest.mark.timeout(150)
def test_plan_counts_one_encode_task_per_keyframe_per_stage(tmp_path: Path) -> None:
    keys = []
    for k in range(4):
        keys += ["--image", str(tmp_path / f"k{k}.png"), str((-1, 0, 24, 48)[k]), "1"]
        (tmp_path / f"k{k}.png").write_bytes(bytes([k]) * 64)  # `farm plan` hashes the file, it decodes nothing
    result = _plan(tmp_path, "-H", "576", "-W", "1024", "-f", "121", "--json", *keys)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    kinds = {k: n for row in plan["stages"] for k, n in row["kinds"].items()}
    assert kinds["image_encode"] == 4 * 2
    missing = _plan(tmp_path, "-f", "121", "--image", str(tmp_path / "nope.png"), "0", "1")
    assert missing.returncode == 2 and "cannot read image" in missing.stderr


def test_a_16_gb_mac_takes_stage2_tiles_streamed(tmp_path: Path) -> None:
    fleet = ('[[workers]]\nname = "studio"\nchip = "Apple M2 Ultra"\nmemory_gb = 128\n\n'
             '[[workers]]\nname = "mbp16"\nchip = "Apple M4 Pro"\nmemory_gb = 16\n')
    result = _plan(tmp_path, "-H", "1088", "-W", "1920", "-f", "121", "--stage2-tiles", "2x2", fleet=fleet)
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("Stage 2"))
    assert "mbp16×" in row and "streamed)" in row, result.stdout
    plan = json.loads(_plan(tmp_path, "-H", "1088", "-W", "1920", "-f", "121", "--stage2-tiles", "2x2", "--json",
                            fleet=fleet).stdout)
    stage2 = next(r for r in plan["stages"] if r["stage"] == "stage2")
    assert stage2["streamed"] == {"mbp16": stage2["workers"]["mbp16"]} and "studio" not in stage2["streamed"]
