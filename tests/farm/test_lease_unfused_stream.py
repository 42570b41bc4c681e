"""An unfused LoRA set's run-time adapters wrap a resident DiT's layers, so its DiT tasks are
never streamed. The cost model gives them no streamed need, and the lease (real Redis) keeps them off a
worker that could hold the DiT only streamed, while the same render with the set fused goes there."""

from __future__ import annotations

from coordinator.plan import costs
from coordinator.plan.resolved import RenderPlan
from coordinator.state.store import FarmStore

GB = 2**30
LORAS = [{"name": "style", "strength": 0.8, "blob": "ab" * 32}]


def _task(render: str, spec: dict) -> dict:
    task = {
        "id": f"{render}.s1",
        "kind": "denoise_stage1",
        "inputs": {},
        "deps": [],
        "capability": "mlx",
        "params": {"pack": "p", "height": 512, "width": 768, "frames": 49, "loras": LORAS},
    }
    costs.annotate([task], RenderPlan.from_stored({"prompt": "fox", **spec}))  # the plan as the store reads it
    return task


def test_an_unfused_lora_task_stays_off_a_streaming_only_worker(store: FarmStore) -> None:
    base = {"pack_bytes": 26 * GB, "loras": LORAS}
    fused, unfused = _task("f", base | {"lora_mode": "fused"}), _task("u", base | {"lora_mode": "unfused"})
    resident, streamed = fused["params"]["min_memory_bytes"], fused["params"]["min_memory_stream_bytes"]
    assert streamed < resident == unfused["params"]["min_memory_bytes"]
    assert "min_memory_stream_bytes" not in unfused["params"]
    small = (streamed + resident) // 2  # a 16-32 GB Mac: the DiT fits only streamed
    assert costs.streams_on(small, fused["params"]) and not costs.streams_on(small, unfused["params"])

    store.register_worker("small", {"memory_bytes": small})
    store.create_render("u", {"prompt": "fox"}, [unfused])
    store.create_render("f", {"prompt": "fox"}, [fused])
    leased = store.lease("small", ["mlx"], 10_000)
    assert leased is not None and leased["id"] == "f.s1"  # u.s1 is first in queue order
    assert store.lease("small", ["mlx"], 10_000) is None
    assert store.get_task("u.s1")["state"] == "queued"
    store.register_worker("big", {"memory_bytes": resident})
    big = store.lease("big", ["mlx"], 10_000)
    assert big is not None and big["id"] == "u.s1"
