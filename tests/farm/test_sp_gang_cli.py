"""`--stage1-parallel` at submit, through the real CLI against a real coordinator (no workers): a degree
that is no whole number in 1..8 is one line, exit 2, nothing queued; a good one (even above the live
workers: the lease falls back) is queued with it in its spec and its gang cap on stage 1 (issue #25)."""

from __future__ import annotations

import pytest

from coordinator.plan.sp_degree import gang_degree
from farm_cli.client import FarmClient
from tests.farm.test_cli_messages import JOIN, coordinator, farm, one_line  # noqa: F401 - the fixture

SMALL = ["-p", "a heron at dusk", "-H", "256", "-W", "384", "-f", "25"]


@pytest.mark.timeout(120)
def test_bad_stage1_parallel_is_one_line_exit_2_and_nothing_is_queued(coordinator):  # noqa: F811
    for value in ("0", "9", "two", "-1", "2.5"):
        result = farm(coordinator, "submit", *SMALL, "--stage1-parallel", value)
        assert result.returncode == 2, (value, result.stderr)
        assert "must be auto or a whole number 1..8" in one_line(result), value
    with FarmClient(coordinator, JOIN[coordinator], timeout=10) as client:
        assert client.list() == []
        good = farm(coordinator, "submit", *SMALL, "--stage1-parallel", "8")
        assert good.returncode == 0, good.stderr
        render = client.get(good.stdout.strip())
        assert render["spec"]["stage1_parallel"] == "8"
        stage1 = next(t for t in render["tasks"] if t["kind"] == "denoise_stage1")
        assert stage1["params"]["gang_cap"] == 8


def test_gang_degree_rule():
    """The one rule gang.lua and the fleet simulation share (coordinator/plan/sp_degree.py)."""
    assert gang_degree(4, idle_at_open=0, joined=1, window_passed=False) == 1  # nobody idle: a plain lease
    assert gang_degree(4, idle_at_open=5, joined=2, window_passed=False) is None  # waits for 4
    assert gang_degree(4, idle_at_open=5, joined=4, window_passed=False) == 4
    assert gang_degree(8, idle_at_open=2, joined=3, window_passed=False) == 3  # K above the idle workers
    assert gang_degree(4, idle_at_open=3, joined=2, window_passed=True) == 2  # the window: what it has
    assert gang_degree(4, idle_at_open=3, joined=1, window_passed=True) == 1
