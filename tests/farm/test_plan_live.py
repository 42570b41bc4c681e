"""`farm plan` against a live farm through the real CLI: the live workers, their measured speeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from coordinator.api.auth import load_or_create_token
from tests.farm.farm_harness import ROOT, farm, wait_done

SPEC = {"prompt": "a fox in the snow", "height": 256, "width": 384, "frames": 25, "seed": 3, "pack": "tiny"}


@pytest.mark.timeout(300)
def test_plan_on_the_live_fleet_reads_what_its_workers_measured(store, tmp_data, tiny_packs) -> None:
    with farm(store, tmp_data, tiny_packs, workers=1) as (client, _procs):
        render = wait_done(client, client.submit(dict(SPEC)))
        kinds = {t["kind"] for t in render["tasks"] if t.get("capability") == "mlx"}
        result = subprocess.run(
            [sys.executable, "-c", "from farm_cli.main import main; main()", "plan", "-p", "a fox in the snow",
             "--coordinator", client.address, "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT,
            env={**os.environ, "FARM_TOKEN": load_or_create_token(tmp_data), "FARM_DATA": str(tmp_data / "cli")})
        assert result.returncode == 0, result.stderr
        plan = json.loads(result.stdout)
        workers = client.workers()
    assert [w["name"] for w in plan["workers"]] == ["w1"]
    assert kinds <= set(workers[0]["cost_ratios"])  # complete.lua learned every kind the render ran
    assert {w for row in plan["stages"] for w in row["workers"]} <= {"w1", "coordinator"}
    reference = sum(t["params"]["cost_s"] for t in render["tasks"] if t.get("capability") == "mlx")
    assert 0 < plan["total_s"] < reference  # the tiny pack on this machine, not an M4 Pro with a full pack
