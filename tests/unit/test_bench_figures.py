"""Bench figures: the overhead bench's forward seconds leave model loads out, and the sparse
bench skips (with its reason, in --json too) a token count whose dense attention would not fit, and the
relay and gang-memory benches run end to end."""

from __future__ import annotations

import json

import pytest

from farm_cli.bench import overhead, sparse


def test_forward_seconds_leave_the_model_loads_out():
    metrics = [{"seconds": 3.0, "load_s": 2.0}, {"seconds": 1.5}, {"seconds": 1.25, "load_s": 0.0}]
    assert overhead.compute_seconds(metrics) == 3.75


def test_a_token_count_too_large_for_the_free_memory_is_skipped(monkeypatch, capsys):
    monkeypatch.setattr(sparse, "available_bytes", lambda: sparse.dense_bytes(8192))
    sparse.run([8192], 1.0, 1, 2, 8192, as_json=True)
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"]["8192"]["skipped"].startswith("dense attention needs ~1.0 GiB")
    assert sparse.dense_bytes(32768) == 16 * 2**30  # the default's 32k: skipped on a 16 GB machine


@pytest.mark.timeout(60)
def test_the_relay_bench_measures_each_stage(capsys):
    from farm_cli.bench import relay

    relay.run(64, 64, 9, 24.0, 1, 1, as_json=True)
    out = json.loads(capsys.readouterr().out)
    assert list(out["stages"]) == ["stage 1", "stage 2"] and out["stages"]["stage 2"]["tokens"] == 2 * 2 * 2
    assert all(0 < s["text_share"] < 0.1 and s["build_s"] > 0 for s in out["stages"].values())
    assert relay.text_share(14080, 126) < relay.text_share(1536, 126)  # self-attention grows with the tokens


@pytest.mark.timeout(180)
def test_the_gang_memory_bench_runs_a_rank_in_the_workers_process(capsys):
    """Both sides run (a gang of 2 over sockets, bit-identical to the plain stage 1, or the bench stops),
    and the report carries the figures docs/performance.md quotes."""
    from farm_cli.bench import gang_memory

    gang_memory.run({"prompt": "a fox", "height": 128, "width": 192, "frames": 9, "seed": 3}, 1, as_json=True)
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["alone_peak_rss"] > out["weights_bytes"] > 0 and out["child_peak_rss"] > 0
    assert out["peak_ratio"] == out["member_peak_rss"] / out["alone_peak_rss"]
