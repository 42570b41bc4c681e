"""The stage-1 sequence-parallel degree chosen from idle workers (pure, no Redis)."""

from dataclasses import replace

import pytest

from coordinator.plan.sp_degree import LINKS, stage1_degree
from ltx_engine.rules.sp_plan import (
    FULL_SIZE,
    OVERLAP_SHARES,
    ShardPlan,
    exposed_wire_s,
    forward_bytes,
    site_bytes,
)

FULL = 17 * 30 * 16  # stage 1 of 1920x1088x121: 8,160 tokens


def test_a_lone_full_size_render_spreads_over_every_idle_mac() -> None:
    assert stage1_degree(None, 4, FULL, LINKS["thunderbolt5"], "M1 Max") == 4
    assert stage1_degree(None, 4, FULL, LINKS["10gbe"], "M1 Max") == 4


def test_fewer_idle_workers_or_a_slow_link_lower_the_degree() -> None:
    assert stage1_degree(None, 1, FULL, LINKS["10gbe"]) == 1
    assert stage1_degree(None, 2, FULL, LINKS["10gbe"]) == 2
    assert stage1_degree(None, 4, FULL, 12e6) == 1  # 100 Mb/s: the gathers cost more than they save
    assert stage1_degree(None, 4, 64, LINKS["10gbe"]) < 4  # a tiny stage: the replicated part dominates


def test_an_explicit_degree_is_an_upper_bound_and_one_is_off() -> None:
    assert stage1_degree(1, 4, FULL, LINKS["thunderbolt5"]) == 1
    assert stage1_degree(3, 4, FULL, 12e6) == 3
    assert stage1_degree(3, 2, FULL, LINKS["thunderbolt5"]) == 2
    with pytest.raises(ValueError):
        stage1_degree(0, 4, FULL, LINKS["10gbe"])


def test_each_gathers_wire_hides_behind_at_most_its_compute() -> None:
    """The step model counts a gather's wire time less the compute behind it, never below zero."""
    plan = ShardPlan(FULL, 4)
    moved = site_bytes(plan, FULL_SIZE)
    assert sum(moved.values()) == forward_bytes(plan, 48, 4096, 2048, 2, 128, 1024)
    slow = 1e6  # every window full: the whole wire less every window
    assert exposed_wire_s(plan, 10.0, slow) == pytest.approx(sum(moved.values()) / slow - sum(OVERLAP_SHARES.values()) * 10)
    fast = 1e12  # the K/V hidden whole: only the output rows (no compute behind them) wait
    assert exposed_wire_s(plan, 10.0, fast) == pytest.approx(moved["output"] / fast)
    assert exposed_wire_s(plan, 0.0, LINKS["10gbe"]) == pytest.approx(sum(moved.values()) / LINKS["10gbe"])


def test_the_text_kv_move_only_where_the_engine_splits_them() -> None:
    """The step model reads the engine's rule: k > 1 and a context row per rank; each rank receives the
    others' shares of both streams' text K/V per layer (1,024 rows over 3: 342 per share, padded)."""
    assert "text" not in site_bytes(ShardPlan(FULL, 1), FULL_SIZE)
    assert "text" not in site_bytes(ShardPlan(FULL, 4), replace(FULL_SIZE, text_tokens=3))
    assert site_bytes(ShardPlan(FULL, 3), FULL_SIZE)["text"] == 2 * 342 * 48 * 2 * (4096 + 2048) * 2
