"""The lease script's warm-model affinity and LoRA sets: among queued DiT tasks, a worker
takes one whose render's LoRA set it holds warm (its `params.warm` name among the worker's models, as
complete.lua records them from a task's metrics) before one it would have to build; with the policy off
it takes the queue's first."""

from __future__ import annotations

import pytest

from coordinator.state.store import FarmStore
from protos.lora_set import warm_key

SET = [{"blob": "ab" * 32, "strength": 0.8}]


def _dit(rid: str, warm: list[str] | None) -> dict:
    params = {"needs": ["transformer"], **({"warm": warm} if warm else {})}
    return {"id": f"{rid}.stage1", "kind": "denoise_stage1", "params": params, "inputs": {}, "deps": [],
            "capability": "mlx"}


@pytest.mark.parametrize(("affinity", "first"), [("1", "b.stage1"), ("0", "a.stage1")])
def test_a_worker_holding_the_fused_set_takes_its_render_first(store: FarmStore, affinity: str, first: str):
    name = warm_key(SET, "fused")
    store.register_worker("w", {})
    store.set_policy(affinity=affinity)
    store.create_render("z", {"prompt": "fox"}, [_dit("z", [name])])
    task = store.lease("w", ["mlx"], 60_000)
    store.complete(task["id"], "w", task["fence"], {}, {"models": ["transformer", name]})  # the set built here
    store.create_render("a", {"prompt": "fox"}, [_dit("a", [warm_key(SET, "unfused")])])  # another set: cold
    store.create_render("b", {"prompt": "fox"}, [_dit("b", [name])])
    assert store.lease("w", ["mlx"], 60_000)["id"] == first
