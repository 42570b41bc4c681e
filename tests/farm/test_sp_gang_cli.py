"""`--stage1-parallel` at submit, through the real CLI against a real coordinator (no workers): a degree
that is no whole number in 1..8 is one line, exit 2, nothing queued; a good one (even above the live
workers: the lease falls back) is queued with it in its spec and its gang cap on stage 1."""

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
        assert stage1["params"]["stage1_parallel_request"] == "8"
        assert stage1["params"]["stage1_degrees"] == list(range(1, 9))  # by the idle count at lease time


def test_gang_degree_rule():
    """The one rule gang.lua and the fleet simulation share (coordinator/plan/sp_degree.py)."""
    table = [1, 2, 3, 4]
    assert gang_degree(table, idle_at_open=1, joined=1, opened_s=0, now_s=0) == 1  # nobody idle: plain lease
    assert gang_degree(table, idle_at_open=5, joined=2, opened_s=0, now_s=1) is None  # waits for 4
    assert gang_degree(table, idle_at_open=5, joined=4, opened_s=0, now_s=1) == 4
    assert gang_degree(table, idle_at_open=3, joined=3, opened_s=0, now_s=0) == 3  # K above the idle ones
    assert gang_degree(table, idle_at_open=3, joined=2, opened_s=0, now_s=2.5) == 2  # the window: what it has
    assert gang_degree(table, idle_at_open=3, joined=1, opened_s=0, now_s=2.5) == 1
    assert gang_degree([1], idle_at_open=8, joined=1, opened_s=0, now_s=0) == 1  # auto on a short stage 1
