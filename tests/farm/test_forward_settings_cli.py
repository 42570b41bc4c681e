"""Flags at submit, through the real CLI against a real coordinator (no workers): a tau list of
the wrong length or not finite, sparse attention on a stage 2 that cannot route, a compute dtype the
backend lacks: one line, exit 2, nothing queued; a good one is queued with both recorded in its spec."""

from __future__ import annotations

import pytest

from farm_cli.client import FarmClient
from tests.farm.test_cli_messages import JOIN, coordinator, farm, one_line  # noqa: F401 - the fixture

BIG = ["-p", "a heron at dusk", "-H", "1024", "-W", "1024", "-f", "25"]  # 4 x 32 x 32 = 4096 stage-2 tokens
REFUSED = {
    "wrong length": ([*BIG, "--sparse-attention", "1.0,1.25"], "stage 2 of this render has 3 steps"),
    "wrong length for --stage2-sigmas": ([*BIG, "--stage2-tiles", "1x1", "--sparse-attention", "1,1.25,1.5",
                            "--stage2-sigmas", "0.6,0"], "has 1 steps"),
    "not finite": ([*BIG, "--sparse-attention", "1.0,nan,1.5"], "not a finite number"),
    "infinite": ([*BIG, "--sparse-attention", "1.0,-inf,1.5"], "not a finite number"),
    "not numbers": ([*BIG, "--sparse-attention", "one"], "not a comma-separated list of taus"),
    "stage cannot route": (["-p", "x", "-H", "256", "-W", "384", "-f", "25", "--sparse-attention", "1,1.25,1.5"],
                           "routes only at >= 4096 tokens"),
    "tiles cannot route": ([*BIG, "--stage2-tiles", "2x2", "--sparse-attention", "1,1.5"], "per stage-2 tile"),
    "dtype the backend lacks": ([*BIG, "--compute-dtype", "float64"], "not one the MLX backend computes"),
}


@pytest.mark.timeout(240)
def test_bad_forward_settings_are_one_line_exit_2_and_nothing_is_queued(coordinator):  # noqa: F811
    for name, (args, words) in REFUSED.items():
        result = farm(coordinator, "submit", *args)
        assert result.returncode == 2, (name, result.stderr)
        line = one_line(result)
        assert words in line, (name, line)
    with FarmClient(coordinator, JOIN[coordinator], timeout=10) as client:
        assert client.list() == []
        good = farm(coordinator, "submit", *BIG, "--sparse-attention", "1.0,1.25,1.5", "--compute-dtype", "float16")
        assert good.returncode == 0, good.stderr
        spec = client.get(good.stdout.strip())["spec"]
        assert spec["sparse_attention"] == [1.0, 1.25, 1.5] and spec["compute_dtype"] == "float16", spec
