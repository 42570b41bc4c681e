"""The lease script hands a worker only tasks whose pack components it holds (real Redis)."""

from __future__ import annotations

from coordinator.state.store import FarmStore


def _task(tid: str, pack: str, needs: list[str]) -> dict:
    return {"id": tid, "kind": "denoise_stage1", "params": {"pack": pack, "needs": needs}, "inputs": {},
            "deps": [], "capability": "mlx"}


def test_lease_skips_tasks_whose_components_the_worker_lacks(store: FarmStore) -> None:
    store.register_worker("full", {"pack_components": {"p": ["transformer", "spatial_upscaler", "vae_decoder"]}})
    store.register_worker("bare", {"pack_components": {"p": ["transformer"], "q": ["vae_decoder"]}})
    store.register_worker("quiet", {"host": "an agent that describes no packs"})
    store.create_render("r", {"prompt": "fox"}, [_task("r.up", "p", ["spatial_upscaler", "vae_decoder"]),
                                                 _task("r.s1", "p", ["transformer"])])
    first = store.lease("bare", ["mlx"], 10_000)
    assert first is not None and first["id"] == "r.s1"  # r.up is first in queue order, but bare lacks its upscaler
    assert store.lease("bare", ["mlx"], 10_000) is None
    assert store.get_task("r.up")["state"] == "queued"  # skipped, not dropped
    leased = store.lease("full", ["mlx"], 10_000)
    assert leased is not None and leased["id"] == "r.up"


def test_a_worker_without_the_pack_gets_none_of_its_tasks(store: FarmStore) -> None:
    store.register_worker("other", {"pack_components": {"q": ["transformer"]}})
    store.register_worker("quiet", {})
    store.create_render("r2", {"prompt": "fox"}, [_task("r2.s1", "p", ["transformer"]),
                                                  {"id": "r2.sum", "kind": "tdp_reduce", "params": {}, "inputs": {},
                                                   "deps": [], "capability": "mlx"}])
    leased = store.lease("other", ["mlx"], 10_000)
    assert leased is not None and leased["id"] == "r2.sum"  # needs nothing from a pack
    assert store.lease("other", ["mlx"], 10_000) is None
    quiet = store.lease("quiet", ["mlx"], 10_000)  # no holdings described: any task
    assert quiet is not None and quiet["id"] == "r2.s1"
