"""The cost model in Redis: lease.lua keeps a task off a worker whose memory cannot hold its predicted
peak, and complete.lua keeps each worker's measured / reference ratio per kind (real Redis)."""

from __future__ import annotations

import time

from coordinator.state.store import FarmStore
from coordinator.views.fleet import cost_ratios

GB = 2**30


def _task(tid: str, min_memory: int | None = None) -> dict:
    params = {"pack": "p", "cost_s": 0.05, **({"min_memory_bytes": min_memory} if min_memory else {})}
    return {"id": tid, "kind": "denoise_stage2", "params": params, "inputs": {}, "deps": [], "capability": "mlx"}


def test_a_task_whose_peak_exceeds_a_workers_memory_is_never_leased_to_it(store: FarmStore) -> None:
    store.register_worker("small", {"memory_bytes": 16 * GB})
    store.register_worker("big", {"memory_bytes": 64 * GB})
    store.create_render("m", {"prompt": "fox"}, [_task("m.big", 40 * GB), _task("m.any")])
    first = store.lease("small", ["mlx"], 10_000)
    assert first is not None and first["id"] == "m.any"  # m.big is first in queue order, but too big
    assert store.lease("small", ["mlx"], 10_000) is None
    assert store.get_task("m.big")["state"] == "queued"
    leased = store.lease("big", ["mlx"], 10_000)
    assert leased is not None and leased["id"] == "m.big"


def test_a_task_whose_streamed_peak_fits_is_leased_to_the_small_worker(store: FarmStore) -> None:
    """Block streaming: resident 40 GB does not fit 16 GB, streamed 10 GB does; 4 GB fits neither."""
    store.register_worker("small", {"memory_bytes": 16 * GB})
    store.register_worker("tiny", {"memory_bytes": 4 * GB})
    task = _task("s.tile", 40 * GB)
    task["params"]["min_memory_stream_bytes"] = 10 * GB
    store.create_render("s", {"prompt": "fox"}, [task])
    assert store.lease("tiny", ["mlx"], 10_000) is None
    leased = store.lease("small", ["mlx"], 10_000)
    assert leased is not None and leased["id"] == "s.tile"


def test_complete_keeps_a_running_ratio_per_worker_and_kind(store: FarmStore) -> None:
    store.register_worker("w", {})
    store.create_render("c", {"prompt": "fox"}, [_task("c.a"), _task("c.b")])
    for _ in range(2):
        leased = store.lease("w", ["mlx"], 10_000)
        assert leased is not None
        time.sleep(0.1)  # lease-to-done ≥ 100 ms against 50 ms of reference seconds
        store.complete(leased["id"], "w", int(leased["fence"]), {}, {})
    per_worker, fleet = cost_ratios(store, ["w", "other"])
    assert per_worker["w"]["denoise_stage2"] >= 2.0 and per_worker["other"] == {}
    assert fleet["denoise_stage2"] == per_worker["w"]["denoise_stage2"]


def _needing(tid: str, needs: list[str]) -> dict:
    return {"id": tid, "kind": "k", "params": {"pack": "p", "needs": needs}, "inputs": {}, "deps": [],
            "capability": "mlx"}


def test_a_worker_prefers_a_task_whose_models_are_warm_in_it(store: FarmStore) -> None:
    store.register_worker("dit", {})
    store.register_worker("cold", {})
    store.create_render("a", {"prompt": "fox"}, [_needing("a.text", ["text_encoder"]),
                                                 _needing("a.dec", ["vae_decoder"]), _needing("a.s2", ["transformer"])])
    warmed = store.lease("dit", ["mlx"], 10_000)
    assert warmed is not None and warmed["id"] == "a.text"  # nothing warm yet: queue order
    store.complete("a.text", "dit", int(warmed["fence"]), {}, {"models": ["transformer"]})
    leased = store.lease("dit", ["mlx"], 10_000)
    assert leased is not None and leased["id"] == "a.s2"  # its DiT is loaded: the DiT task, not the decode first
    first = store.lease("cold", ["mlx"], 10_000)  # nothing warm: the queue's first
    assert first is not None and first["id"] == "a.dec"
