"""The critical-path split of `farm bench scale`: from tasks' timestamps alone, no Redis or gRPC."""

from __future__ import annotations

import pytest

from farm_cli.bench.critical import by_part, by_stage, critical_path

B = 1_700_000_000_000  # Redis clock ms; 0 means "never" in the store


def _path(tasks: list[dict], end: int) -> list:
    return critical_path(tasks, B, B + end)


def _t(tid: str, worker: str, leased: int, done: int, deps=(), cap: str = "mlx", **metrics) -> dict:
    return {"id": f"r.{tid}", "worker": worker, "leased_ms": B + leased, "done_ms": B + done, "state": "done",
            "deps": [f"r.{d}" for d in deps], "capability": cap, "metrics": metrics}


def test_a_serial_chain_covers_the_wall_and_names_each_part():
    tasks = [_t("text", "w1", 100, 1100, seconds=0.8, load_s=0.3, fetch_s=0.05, upload_s=0.05),
             _t("stage1", "w1", 1200, 3200, ("text",), seconds=2.0),
             _t("stage2.cut", "coordinator", 3300, 3400, ("stage1",), cap="coordinator")]
    path = _path(tasks, 4000)
    parts = by_part(path)
    assert sum(s.seconds for s in path) == pytest.approx(4.0)
    assert parts["compute"] == pytest.approx(0.5 + 2.0) and parts["load"] == pytest.approx(0.3)
    assert parts["transfer"] == pytest.approx(0.1) and parts["worker overhead"] == pytest.approx(0.1)
    assert parts["coordinator"] == pytest.approx(0.1)
    assert parts["idle gap"] == pytest.approx(0.1 + 0.1 + 0.1) and parts["assembly"] == pytest.approx(0.6)
    assert list(by_stage(path)) == ["text", "stage1", "stage2"]


def test_the_path_follows_what_each_task_waited_for():
    # Two tiles in parallel after prep; the slow one (w2) is on the path, the fast one is not.
    tasks = [_t("prep", "w1", 0, 1000, seconds=1.0),
             _t("stage2.s0.t0", "w1", 1100, 2000, ("prep",), seconds=0.9),
             _t("stage2.s0.t1", "w2", 1500, 3000, ("prep",), seconds=1.5),
             _t("stage2.s0", "coordinator", 3050, 3100, ("stage2.s0.t0", "stage2.s0.t1"), cap="coordinator")]
    path = _path(tasks, 3100)
    assert sum(s.seconds for s in path) == pytest.approx(3.1)
    assert by_part(path)["compute"] == pytest.approx(1.0 + 1.5)  # prep and the slow tile only
    assert by_part(path)["idle gap"] == pytest.approx(0.5 + 0.05)  # w2 leased its tile 0.5 s after prep


def test_a_busy_worker_is_what_a_ready_task_waited_for():
    # One worker, two independent tasks: the second waited for the first (its worker), not for a dep.
    tasks = [_t("a", "w1", 0, 2000, seconds=2.0), _t("b", "w1", 2000, 3000, seconds=1.0)]
    path = _path(tasks, 3000)
    assert by_part(path)["compute"] == pytest.approx(3.0) and by_part(path)["idle gap"] == 0


def test_no_done_task_is_all_gap():
    assert by_part(_path([], 1500))["idle gap"] == 1.5


def test_the_model_learns_from_the_one_worker_run_and_places_the_same_plan_on_more():
    from farm_cli.bench.scale_model import learned, predicted_wall

    def task(tid: str, seconds: float, deps=(), load: float = 0.0) -> dict:
        return {"id": f"r.{tid}", "kind": "transformer_forward", "capability": "mlx", "deps": [f"r.{d}" for d in deps],
                "params": {"cost_s": 2.0, "needs": ["dit"]}, "state": "done", "metrics": {"seconds": seconds + load, "load_s": load}}

    tasks = [task("a", 4.0, load=1.0), task("b", 4.0, ("a",)), task("c", 4.0, ("a",))]
    ratios, loads = learned(tasks)
    assert ratios == {"transformer_forward": pytest.approx(2.0)} and loads == {"transformer_forward": 1.0}
    one, two = predicted_wall(tasks, 1, ratios, loads), predicted_wall(tasks, 2, ratios, loads)
    assert (one, two) == (pytest.approx(1 + 3 * 4), pytest.approx(1 + 4 + 1 + 4))  # the 2nd worker loads too


def test_the_model_gangs_a_stage_1_that_asks_for_2_only_where_2_workers_are_idle():
    """`farm bench scale`'s spec asks stage 1 for a gang of N: the model runs it alone on 1 worker and as
    a gang of 2 on 2 (the same table the lease reads), and reports it beside the measured degrees."""
    from farm_cli.bench.scale_model import model_vs_measured

    def stage1(degree: int) -> dict:
        params = {"cost_s": 8.0, "cells": 192, "sigmas": [1.0, 0.5, 0.0], "needs": ["dit"],
                  "stage1_parallel_request": "2", "stage1_degrees": [1, 2]}
        return {"id": "r.stage1", "kind": "denoise_stage1", "capability": "mlx", "deps": [], "params": params,
                "state": "done", "leased_ms": 0, "done_ms": 16000 // degree,
                "metrics": {"seconds": 16.0 / degree, "load_s": 0.0, "stage1_parallel": degree}}

    m = model_vs_measured([stage1(1)], [stage1(2)], 2)
    s1 = m["stage1"]
    assert s1["one"] == {"degree_model": [1], "degree": [1], "model_s": [16.0], "measured_s": [16.0]}
    assert s1["many"]["degree_model"] == [2] and s1["many"]["degree"] == [2] and s1["many"]["measured_s"] == [8.0]
    assert 8.0 < s1["many"]["model_s"][0] < 16.0 and m["many_s"] == pytest.approx(s1["many"]["model_s"][0], abs=2.1)
    # the coordinator's assembly after the last task, taught by the 1-worker run, ends both sides alike
    tail = model_vs_measured([stage1(1)], [stage1(2)], 2, assembly_s=1.5)
    assert (tail["one_s"], tail["many_s"]) == (pytest.approx(m["one_s"] + 1.5), pytest.approx(m["many_s"] + 1.5))


def test_the_models_gang_prices_the_packs_dit_over_its_link_not_a_full_size_one_over_10gbe():
    """A bench DiT (8 blocks, 256 wide, a 32-wide audio stream) gathers kilobytes where a full-size one
    gathers hundreds of megabytes, and replicates almost nothing: on this machine's loopback its gang of 2
    takes about half of the stage alone, where full-size dims over 10 GbE would model almost no gain."""
    from coordinator.plan import placement
    from farm_cli.bench.scale_model import model_vs_measured
    from ltx_engine.rules.sp_plan import FULL_SIZE, DitDims
    from ltx_engine.tiny.tiny_pack import tiny_embedded_config

    bench = DitDims.of(tiny_embedded_config(dit="bench")["transformer"], itemsize=4)
    assert (bench.layers, bench.video_width, bench.audio_width, bench.itemsize) == (8, 256, 32, 4)
    assert FULL_SIZE.replicated_scale == 1.0 and bench.replicated_scale < 1e-3

    def stage1(degree: int) -> dict:
        params = {"cost_s": 8 * 1.57, "cells": 192, "sigmas": [1.0 - i / 8 for i in range(9)], "needs": ["dit"],
                  "stage1_parallel_request": "2", "stage1_degrees": [1, 2]}
        return {"id": "r.stage1", "kind": "denoise_stage1", "capability": "mlx", "deps": [], "params": params,
                "state": "done", "leased_ms": 0, "done_ms": 13000 // degree,
                "metrics": {"seconds": 13.0 / degree, "load_s": 0.0, "stage1_parallel": degree}}

    loopback = placement.SpRule(9e9, default=1, dims=bench)
    modelled = model_vs_measured([stage1(1)], [stage1(2)], 2, loopback)["stage1"]["many"]["model_s"][0]
    full = model_vs_measured([stage1(1)], [stage1(2)], 2, placement.SpRule(1.1e9, default=1))["stage1"]["many"]["model_s"][0]
    assert 6.5 <= modelled < 6.6  # half of 13 s, plus the kilobytes' wire
    assert full > 9.0  # a real DiT's replicated part and 10 GbE gathers: the model this bench read before


def test_the_same_tasks_slower_on_more_workers_are_named_per_kind_and_a_gang_is_left_out():
    from farm_cli.bench.critical import slowdown

    def task(kind: str, seconds: float, load: float = 0.0, degree: int = 1, capability: str = "mlx") -> dict:
        return {"id": f"r.{kind}", "kind": kind, "capability": capability, "state": "done",
                "metrics": {"seconds": seconds, "load_s": load, "stage1_parallel": degree}}

    one = [task("transformer_forward", 2.0), task("transformer_forward", 4.0, load=1.0), task("decode_tile", 1.0),
           task("denoise_stage1", 12.0), task("tdp_step", 0.1, capability="coordinator")]
    many = [task("transformer_forward", 2.75), task("transformer_forward", 3.25), task("decode_tile", 1.0),
            task("denoise_stage1", 6.0, degree=2), task("tdp_step", 0.5, capability="coordinator")]
    # 2.5 s a tile alone (the load left out) against 3.0 s: 20 % longer; the decode the same; the gang and
    # the coordinator's step are not a worker's same work, so they are not compared
    assert slowdown(one, many) == {"transformer_forward": 0.2, "decode_tile": 0.0}
