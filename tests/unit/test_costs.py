"""The cost model and the placement simulation (pure): calibration against the seed's Mac figures,
per-task seconds and peaks in a plan, the submit refusal with numbers, pull scheduling and the ETA."""

from __future__ import annotations

import re

import pytest

from coordinator.plan import costs, placement
from coordinator.plan.graph import SpecError
from coordinator.plan.render import normalize_spec, plan_render, validate_spec

GB = 2**30


@pytest.mark.parametrize(("tokens", "seconds"), [(1248, 7.23), (2400, 13.71), (4992, 29.25), (9600, 63.6)])
def test_forward_matches_the_m4_pro_steps(tokens: int, seconds: float) -> None:
    """Seed 003, M4 Pro, 2.5 q8, --distilled float32: stage-1 and stage-2 seconds per step."""
    assert costs.dit_forward_s(tokens) == pytest.approx(seconds, rel=0.03)


def test_m1_max_step_from_its_speed() -> None:
    """M1 Max: 139 s per stage-2 step at 17,856 tokens (float32)."""
    assert costs.dit_forward_s(17_856) / costs.chip_speed("Apple M1 Max") == pytest.approx(139, rel=0.03)
    assert costs.chip_speed("x86_64") == 1.0 and costs.chip_speed("Apple M4 Pro") == 1.0


def test_attention_term_makes_tiles_cheaper_than_their_share() -> None:
    whole = costs.dit_forward_s(32_640)
    assert 4 * costs.dit_forward_s(32_640 // 4) < 0.8 * whole


def _plan(pack_bytes: int | None, **spec: object) -> list[dict]:
    s = normalize_spec({"prompt": "fox", "height": 512, "width": 768, "frames": 97, **spec})
    s = s.resolve(decode_tiles="off", pack_bytes=pack_bytes)  # what validation would have resolved
    return plan_render(s, "r")


def test_every_task_carries_its_seconds_and_worker_tasks_their_peak() -> None:
    tasks = _plan(26 * GB)
    by_kind = {t["kind"]: t["params"] for t in tasks}
    assert all(t["params"]["cost_s"] > 0 for t in tasks)
    assert by_kind["denoise_stage2"]["cost_s"] == pytest.approx(3 * costs.dit_forward_s(13 * 16 * 24), rel=1e-3)
    assert by_kind["denoise_stage1"]["cost_s"] == pytest.approx(8 * costs.dit_forward_s(13 * 8 * 12), rel=1e-3)
    assert 21 * GB < by_kind["denoise_stage2"]["peak_bytes"] < 30 * GB
    assert by_kind["denoise_stage2"]["min_memory_bytes"] > by_kind["denoise_stage2"]["peak_bytes"]
    tiny = {t["kind"]: t["params"] for t in _plan(2_000_000)}
    assert tiny["denoise_stage2"]["peak_bytes"] < 0.1 * GB  # a reduced pack is placed by its own size
    assert "peak_bytes" not in {k for t in _plan(None) for k in t["params"]}  # nobody described the pack


def test_tiles_cost_their_own_tokens() -> None:
    tasks = _plan(26 * GB, stage2_tiles="2x2")
    tiles = [t for t in tasks if t["kind"] == "transformer_forward"]
    whole = costs.dit_forward_s(13 * 16 * 24)
    assert len(tiles) == 4 * 2 and all(whole / 4 < t["params"]["cost_s"] < whole / 2 for t in tiles)


def _fleet(memory_gb: float) -> list[dict]:
    return [{"packs": ["tiny"], "pack_bytes": {"tiny": 26 * GB}, "memory_bytes": int(memory_gb * GB)}]


def test_a_render_no_worker_can_hold_is_refused_with_the_numbers() -> None:
    spec = normalize_spec({"prompt": "fox", "height": 1088, "width": 1920, "frames": 121})
    with pytest.raises(SpecError) as refused:
        spec = validate_spec(spec, _fleet(32))
    line = str(refused.value)
    assert "GiB" in line and "stage2" in line and "24.0 of its 32.0 GiB" in line
    validate_spec(normalize_spec({"prompt": "fox", "height": 1088, "width": 1920, "frames": 121}), _fleet(192))


def test_pull_scheduling_gives_the_next_task_to_the_first_free_worker() -> None:
    fast, slow = placement.Slot("fast", ratios={"t": 1.0}), placement.Slot("slow", ratios={"t": 4.0})
    tasks = [{"id": f"x{i}", "kind": "t", "params": {"cost_s": 1.0}, "deps": [], "capability": "mlx"}
             for i in range(5)]
    placed = placement.simulate(tasks, [fast, slow])
    assert [p.slot for p in placed] == ["fast", "slow", "fast", "fast", "fast"]
    assert max(p.end for p in placed) == 4.0


def test_memory_keeps_a_task_off_a_small_worker() -> None:
    small = placement.Slot("small", memory_bytes=16 * GB, ratios={"t": 0.1})
    big = placement.Slot("big", memory_bytes=64 * GB, ratios={"t": 1.0})
    task = {"id": "x", "kind": "t", "params": {"cost_s": 1.0, "min_memory_bytes": 40 * GB}, "deps": []}
    assert [p.slot for p in placement.simulate([task], [small, big])] == ["big"]
    assert placement.simulate([task], [small]) == []


def test_eta_runs_what_is_left_after_the_running_task() -> None:
    slots = [placement.Slot("w", ratios={"a": 2.0, "b": 1.0})]
    views = [{"id": "r.a", "kind": "a", "cost_s": 10.0, "deps": [], "display": "done"},
             {"id": "r.b", "kind": "b", "cost_s": 10.0, "deps": ["r.a"], "display": "running", "worker": "w",
              "leased_ms": 4_000, "progress": {"step": 1, "total": 3}},  # 6 s for a third: 12 s left
             {"id": "r.c", "kind": "a", "cost_s": 5.0, "deps": ["r.b"], "display": "waiting"}]
    assert placement.eta_seconds(views, slots, 10_000) == pytest.approx(12 + 10)
    assert placement.eta_seconds([{**v, "cost_s": None} for v in views], slots, 10_000) is None


def test_a_slow_worker_stays_slow_on_a_kind_it_never_ran() -> None:
    filled = costs.fill_ratios({"fast": {"a": 1.0, "b": 2.0}, "slow": {"a": 4.0}, "new": {}})
    assert filled["slow"]["b"] == pytest.approx(8.0) and filled["fast"]["b"] == 2.0
    assert filled["new"]["a"] == pytest.approx(2.0)  # the median worker's speed


def test_bench_model_leads_with_the_same_plan_and_says_what_differs_after() -> None:
    from farm_cli.bench.model import model

    lines = model(4, "M1 Max", 96, 2, "2x2")
    assert "the same plan" in lines[0]
    rows = [i for i, line in enumerate(lines) if line.startswith(("  one render", "  queue of"))][:2]
    speedups = [float(lines[i].split("x  ")[0].split()[-1]) for i in rows]
    walls = [re.search(r"wall s +(\d+) +(\d+)", lines[i]).groups() for i in rows]
    same, fleet = ([float(w[k]) for w in walls] for k in (0, 1))  # one Mac on the fleet's plan; four Macs
    assert all(1.5 < r <= 4 for r in speedups)  # four Macs help, never more than four times the same plan
    assert speedups == pytest.approx([s / f for s, f in zip(same, fleet, strict=True)], rel=0.01)
    other = next(line for line in lines if "against 1 Mac on another plan" in line)
    untiled = [float(n) for n in re.findall(r"(\d+) s\b", other)]  # one Mac on its own untiled plan
    ratios = [float(w.rstrip("x,")) for w in other.split() if w.endswith(("x", "x,"))]
    # Over another plan (longer or shorter) the ceiling is four times the ratio of the two plans' times.
    assert len(ratios) == 2 and all(r <= 4 * u / s for r, u, s in zip(ratios, untiled, same, strict=True))
    assert "assumptions:" in lines and any("redundancy" in line for line in lines)


def test_bench_model_prices_a_30_second_chunked_clip_with_each_carry() -> None:
    """Both carries help on 4 Macs and never beat 4x; the latent carry, whose next window's stage 1 waits
    only for the stage 1 before it, is never slower on the fleet than the decoded carry."""
    from farm_cli.bench.model import model

    lines = model(4, "M1 Max", 96, 2, "2x2")
    at = next(i for i, line in enumerate(lines) if line.startswith("a 30-second clip, 1280x704x721 --chunked"))
    walls = {}
    for line in lines[at + 1:at + 3]:
        carry, one, four, ratio = re.match(r"  (\w+) carry: (\d+) s on 1 Mac, (\d+) s on 4: ([\d.]+)x", line).groups()
        walls[carry] = float(four)
        assert 1.0 < float(ratio) <= 4 and float(ratio) == pytest.approx(float(one) / float(four), abs=0.01)
    assert set(walls) == {"decoded", "latent"} and walls["latent"] <= walls["decoded"]


def test_tiles_are_dealt_to_whoever_ends_them_soonest() -> None:
    # 1x, 0.5x, 0.25x and 10 equal tiles: pull would give the slow worker a second tile at t=4 (ending at 8);
    # dealing ends the step at 6, the discrete optimum (ideal split 10 / 1.75 = 5.7).
    slots = [placement.Slot(n, ratios={"t": r}) for n, r in (("fast", 1.0), ("med", 2.0), ("slow", 4.0))]
    tiles = [{"id": f"x{i}", "kind": "t", "params": {"cost_s": 1.0, "tile_index": i}, "deps": [], "capability": "mlx"}
             for i in range(10)]
    placed = placement.simulate(tiles, slots)
    assert max(p.end for p in placed) == 6.0
    assert sum(p.slot == "slow" for p in placed) == 1


def test_deal_takes_counts_what_faster_peers_end_first() -> None:
    peers = [(0.0, 1.0), (0.0, 2.0)]  # idle 1x and 0.5x peers; the asker takes 4 s a tile
    assert placement.peer_tiles_before(4.0, 0.0, 1.0) == 3  # ends at 1, 2, 3 before 0.9 x 4
    assert not placement.deal_takes(3, 4.0, peers) and not placement.deal_takes(4, 4.0, peers)
    assert placement.deal_takes(5, 4.0, peers)  # more tiles than they end first: take one now
    assert placement.deal_takes(1, 1.0, [(0.0, 1.0)])  # an equal peer never holds a tile back
    assert placement.deal_takes(2, 4.0, [(10.0, 1.0)])  # a busy fast peer frees up too late


def test_bench_dealing_ideal_is_tiles_over_summed_rates() -> None:
    from farm_cli.bench.dealing import ideal_seconds

    assert ideal_seconds(10, {"fast": 1.0, "med": 2.0, "slow": 4.0}) == pytest.approx(10 / 1.75)


def test_auto_tiles_fit_the_smallest_worker_holding_the_pack() -> None:
    raw = {"prompt": "fox", "height": 1088, "width": 1920, "frames": 121, "stage2_tiles": "auto"}
    even = normalize_spec(raw)
    even = validate_spec(even, _fleet(64) + _fleet(64))
    assert even.stage2_tiles == "1x1x2"  # both hold the fleet's own split
    mixed = normalize_spec(raw)
    mixed = validate_spec(mixed, _fleet(64) + _fleet(36))
    tiles = [t for t in plan_render(mixed, "r") if t["kind"] == "transformer_forward"]
    assert mixed.stage2_tiles != "1x1x2" and all(t["params"]["min_memory_bytes"] <= 36 * GB for t in tiles)
    slow_small = normalize_spec(raw)  # a fast big Mac alone ends the step sooner than with a slow small one
    slow_small = validate_spec(slow_small, [{**_fleet(64)[0], "chip": "M3 Ultra"}, {**_fleet(36)[0], "chip": "M1"}])
    assert slow_small.stage2_tiles == "1x1x2"
    too_small = normalize_spec(raw)
    too_small = validate_spec(too_small, _fleet(64) + _fleet(24))  # no count up to 4 a Mac fits 24 GB: the lease keeps them off
    assert too_small.stage2_tiles == "1x1x2"


def test_the_farm_eta_queues_a_render_behind_the_one_before_it_and_leaves_the_slots_alone() -> None:
    """One simulation for every unfinished render (coordinator/views/eta.py): the second waits for the first,
    whoever asks, and the caller's slots are not moved (the dashboard list once reused them per row)."""
    slots = [placement.Slot("w", ratios={"a": 1.0})]
    first = [{"id": "r1.a", "kind": "a", "cost_s": 10.0, "deps": [], "display": "queued"}]
    second = [{"id": "r2.a", "kind": "a", "cost_s": 5.0, "deps": [], "display": "queued"}]
    assert placement.farm_eta_seconds([first, second], slots, 0) == [pytest.approx(10), pytest.approx(15)]
    assert placement.farm_eta_seconds([first, [{**second[0], "cost_s": None}]], slots, 0)[1] is None
    assert slots[0].free_at == 0.0 and placement.eta_seconds(second, slots, 0) == pytest.approx(5)


def test_streamed_peak_and_time_and_who_streams() -> None:
    """Block streaming: the streamed peak is the resident one less all but two blocks (non-block weights +
    2 blocks + activations); a slot streams only where the resident peak does not fit, ~5 % slower."""
    params = {"tile": {"frames": [0, 16], "height": [0, 20], "width": [0, 32]}}
    resident = costs.peak_bytes("transformer_forward", params)
    streamed = costs.stream_peak_bytes("transformer_forward", params)
    acts = costs.DIT_BYTES_PER_TOKEN * 16 * 20 * 32
    weights = costs.WEIGHTS["transformer"]
    held = weights * (costs.NONBLOCK_FRACTION + (1 - costs.NONBLOCK_FRACTION) * 2 / costs.DIT_BLOCKS)
    assert streamed == pytest.approx(acts + held, rel=1e-6) and streamed < 0.5 * resident
    assert costs.stream_peak_bytes("decode_tile", {}) == costs.peak_bytes("decode_tile", {})
    task = {"kind": "transformer_forward", "params": {**params, "cost_s": 100.0,
            "min_memory_bytes": costs.min_memory_bytes(resident), "min_memory_stream_bytes": costs.min_memory_bytes(streamed)}}
    big, small, tiny = (placement.Slot(n, "Apple M4 Pro", m * GB) for n, m in (("big", 64), ("small", 16), ("tiny", 8)))
    assert big.holds(task) and not big.streams(task) and big.seconds(task) == pytest.approx(100.0)
    assert small.holds(task) and small.streams(task) and small.seconds(task) == pytest.approx(100.0 * 1.05)
    assert not tiny.holds(task)  # not even its streamed peak fits 8 GB
