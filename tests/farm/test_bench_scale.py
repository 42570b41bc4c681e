"""`farm bench scale` through the real command at a tiny size: its JSON's shape, the critical path
covering the measured wall time, and stage 1 alone on 1 worker and ganged on 2 (the same plan: the
degree is picked at lease time). Never a timed assertion on the speed-up itself; the time limit is
sized for a CI machine running three test processes at once (a 110 s limit was seen to run out there).
The tiny pack keeps it cheap (the bench's default pack differs only in its DiT's size)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm_cli.bench.critical import PARTS
from tests.farm.farm_harness import ROOT

CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]


def _covers(side: dict) -> None:
    """The path's parts sum to the wall time (timestamps are whole ms: a little rounding)."""
    assert set(side["parts"]) == set(PARTS)
    assert side["path_sum_s"] == pytest.approx(side["wall_s"], abs=0.01)
    assert sum(side["parts"].values()) == pytest.approx(side["wall_s"], abs=0.02)
    assert side["parts"]["compute"] > 0 and "stage1" in side["stages"]


@pytest.mark.timeout(420)
def test_bench_scale_json_and_its_critical_path(tmp_path: Path, tiny_packs: Path) -> None:
    data = tmp_path / "data"
    (data / "packs").mkdir(parents=True)
    (data / "packs" / "tiny").symlink_to(tiny_packs / "tiny")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")} | {"PYTHONPATH": str(ROOT)}
    # 128x256: the smallest frame whose stage 2 still splits 1x2 at the bench's 5-cell tile overlap (the same
    # task graph as at 256x384, a third of the pixels); the JSON's shape does not depend on the size.
    done = subprocess.run([*CLI, "bench", "scale", "-H", "128", "-W", "256", "-f", "9", "--stage2-tiles", "1x2", "--decode-tiles", "auto",
                           "--pairs", "1", "--queue", "2", "--queue-pairs", "1", "--pack", "tiny", "--data", str(data), "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["workers"] == 2 and result["pairs"] == 1 and result["queue_renders"] == 2
    # Warm by default: each farm's warm-up renders (their own prompts) left the lone worker every model the
    # measured render runs, so its critical path holds no model load.
    assert result["warm"] is True and result["one"]["critical_path"]["one"]["parts"]["load"] == 0
    for key in ("speedup", "queue_speedup"):
        assert result[key] > 0 and result[f"{key}_spread"][0] <= result[key] <= result[f"{key}_spread"][1]
    for block in (result["one"], result["queue"]):
        for side in block["critical_path"].values():
            _covers(side)
        assert set(block["model"]) >= {"one_s", "many_s", "speedup", "error"} and block["model"]["many_s"] > 0
    one, many = result["one"]["critical_path"]["one"], result["one"]["critical_path"]["many"]
    assert one["stage1_gangs"] == [1] and many["stage1_gangs"] == [2], (one["stage1_gangs"], many["stage1_gangs"])
    s1 = result["one"]["model"]["stage1"]  # the model gangs the same stage 1 (placement.simulate with sp)
    assert s1["one"]["degree_model"] == [1] and s1["many"]["degree_model"] == [2] and s1["many"]["degree"] == [2], s1
    pins = result["one"]["critical_path"]["many"]["pinning"]
    if sys.platform == "linux" and len(os.sched_getaffinity(0)) >= 2:  # each worker on a core of its own
        assert len(set(pins["allowed"])) == 2 and all(a.isdigit() for a in pins["allowed"]), pins
    # The model's gang is priced with the pack's own DiT (the tiny pack's 2 blocks, 64 wide, float32 on the
    # CPU backend) over this machine's measured loopback, not a full-size DiT over 10 GbE.
    gang = result["model_gang"]
    assert (gang["dit"]["layers"], gang["dit"]["video_width"], gang["dit"]["itemsize"]) == (2, 64, 4), gang
    assert gang["link_bytes_per_s"] > 1e8, gang
    # The same tasks' compute on 2 workers against 1, per kind that ran alone on both sides (the ganged
    # stage 1 is not among them).
    slow = result["one"]["slowdown"]
    assert "transformer_forward" in slow and "text_encode" in slow, slow
    assert not {"denoise_stage1", "tdp_step", "tdp_cut"} & set(slow), slow
