"""An unfused LoRA set streams like a fused one: its run-time adapters wrap each streamed block's layers as
the block binds (ltx_engine/loading/streaming.py), so the cost model gives its DiT tasks the same streamed
need, and the lease (real Redis) hands them to a worker that can hold the DiT only streamed, in queue order,
while a task whose streamed need does not fit either stays queued for a larger worker."""

from __future__ import annotations

from coordinator.plan import costs
from coordinator.plan.resolved import RenderPlan
from coordinator.state.store import FarmStore

GB = 2**30
LORAS = [{"name": "style", "strength": 0.8, "blob": "ab" * 32}]


def _task(render: str, spec: dict, frames: int = 49) -> dict:
    task = {
        "id": f"{render}.s1",
        "kind": "denoise_stage1",
        "inputs": {},
        "deps": [],
        "capability": "mlx",
        "params": {"pack": "p", "height": 512, "width": 768, "frames": frames, "loras": LORAS},
    }
    costs.annotate([task], RenderPlan.from_stored({"prompt": "fox", **spec}))  # the plan as the store reads it
    return task


def test_an_unfused_lora_task_streams_on_a_streaming_only_worker(store: FarmStore) -> None:
    base = {"pack_bytes": 26 * GB, "loras": LORAS}
    fused, unfused = _task("f", base | {"lora_mode": "fused"}), _task("u", base | {"lora_mode": "unfused"})
    resident, streamed = fused["params"]["min_memory_bytes"], fused["params"]["min_memory_stream_bytes"]
    assert streamed < resident == unfused["params"]["min_memory_bytes"]
    assert unfused["params"]["min_memory_stream_bytes"] == streamed
    small = (streamed + resident) // 2  # a 16-32 GB Mac: the DiT fits only streamed
    assert costs.streams_on(small, fused["params"]) and costs.streams_on(small, unfused["params"])
    long = _task("l", base | {"lora_mode": "unfused"}, frames=1921)  # its activations alone exceed `small`
    assert long["params"]["min_memory_stream_bytes"] > small and not costs.streams_on(small, long["params"])

    store.register_worker("small", {"memory_bytes": small})
    store.create_render("l", {"prompt": "fox"}, [long])
    store.create_render("u", {"prompt": "fox"}, [unfused])
    store.create_render("f", {"prompt": "fox"}, [fused])
    leased = [store.lease("small", ["mlx"], 10_000) for _ in range(2)]
    assert [t["id"] for t in leased if t] == ["u.s1", "f.s1"]  # l.s1 is first in queue order
    assert store.lease("small", ["mlx"], 10_000) is None
    assert store.get_task("l.s1")["state"] == "queued"
    store.register_worker("big", {"memory_bytes": long["params"]["min_memory_bytes"]})
    big = store.lease("big", ["mlx"], 10_000)
    assert big is not None and big["id"] == "l.s1"
