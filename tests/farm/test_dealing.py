"""Speed-aware dealing and fair share in the lease script (real Redis): a slow worker leaves a step's
tile for faster peers exactly when placement.deal_takes says so, and submitters share the fleet."""

from __future__ import annotations

import time

import pytest

from coordinator.plan import placement
from coordinator.state.store import FarmStore

KIND = "transformer_forward"
RATIOS = {"fast": 1.0, "med": 2.0, "slow": 4.0}  # seconds per reference second: 1x, 0.5x, 0.25x


def _tiles(rid: str, n: int, cost_s: float, step: int = 0) -> list[dict]:
    return [{"id": f"{rid}.s{step}.t{i}", "kind": KIND, "params": {"step": step, "tile_index": i, "cost_s": cost_s},
             "inputs": {}, "deps": [], "capability": "mlx"} for i in range(n)]


def _fleet(store: FarmStore, ratios: dict[str, float]) -> None:
    for name, ratio in ratios.items():
        store.register_worker(name, {})
        store.worker_seen(name, "idle", "")
        store.client.hset(store.key("costratio", name), KIND, ratio)  # what complete.lua has learned


def _peers(store: FarmStore, asker: str, cost_s: float) -> list[tuple[float, float]]:
    """(seconds until free, seconds per tile) of the asker's peers, from the store as lease.lua reads it."""
    now = store.client.time()
    now_s = now[0] + now[1] / 1e6
    out = []
    for name, ratio in RATIOS.items():
        if name == asker:
            continue
        current = store.client.hget(store.key("worker", name), "current_task") or ""
        free = 0.0
        if current:
            task = store.get_task(current)
            free = max(0.0, task["leased_ms"] / 1000 + task["params"]["cost_s"] * ratio - now_s)
        out.append((free, cost_s * ratio))
    return out


def _queued(store: FarmStore, rid: str) -> int:
    return sum(t["state"] == "queued" for t in store.render_tasks(rid))


@pytest.mark.parametrize("order", [("slow", "med", "fast", "slow", "med", "fast"), ("fast", "slow", "med", "slow")])
def test_lease_deals_tiles_as_deal_takes_says(store: FarmStore, order: tuple[str, ...]) -> None:
    _fleet(store, RATIOS)
    store.create_render("r", {"prompt": "fox"}, _tiles("r", 4, cost_s=30.0))
    took = []
    for asker in order:
        queued = _queued(store, "r")
        expect = queued > 0 and placement.deal_takes(queued, 30.0 * RATIOS[asker], _peers(store, asker, 30.0))
        leased = store.lease(asker, ["mlx"], 60_000)
        assert (leased is not None) == expect, (asker, queued, took)
        if leased:
            took.append(asker)
    assert "slow" not in took and "fast" in took  # the 0.25x worker leaves every tile to faster peers


def test_equal_workers_never_decline_and_dealing_can_be_turned_off(store: FarmStore) -> None:
    _fleet(store, {"a": 1.0, "b": 1.0, "slow": 4.0})
    store.create_render("r", {"prompt": "fox"}, _tiles("r", 3, cost_s=30.0))
    assert store.lease("slow", ["mlx"], 60_000) is None
    assert store.get_task("r.s0.t0")["state"] == "queued"  # left for a faster peer, not dropped
    assert store.lease("a", ["mlx"], 60_000) is not None and store.lease("b", ["mlx"], 60_000) is not None
    store.set_policy(dealing="0")
    assert store.lease("slow", ["mlx"], 60_000) is not None  # even dealing: the next tile to whoever asks


def test_a_tile_that_waited_as_long_as_the_asker_takes_goes_to_it(store: FarmStore) -> None:
    _fleet(store, RATIOS)
    store.create_render("r", {"prompt": "fox"}, _tiles("r", 2, cost_s=0.1))  # 0.4 s on the slow worker
    assert store.lease("slow", ["mlx"], 60_000) is None
    time.sleep(0.5)  # the fast peers never came: the step must not wait on them
    assert store.lease("slow", ["mlx"], 60_000) is not None


def test_a_lost_or_too_small_peer_does_not_hold_a_tile_back(store: FarmStore) -> None:
    _fleet(store, RATIOS)
    store.register_worker("fast", {"memory_bytes": 8 * 2**30})
    store.worker_seen("fast", "idle", "")
    store.worker_seen("med", "lost", "")
    tiles = _tiles("r", 2, cost_s=30.0)
    for t in tiles:
        t["params"]["min_memory_bytes"] = 16 * 2**30
    store.create_render("r", {"prompt": "fox"}, tiles)
    assert store.lease("slow", ["mlx"], 60_000) is not None


def _render(store: FarmStore, rid: str, who: str, n: int) -> None:
    tasks = [{"id": f"{rid}.k{i}", "kind": "decode_audio", "params": {}, "inputs": {}, "deps": [],
              "capability": "mlx"} for i in range(n)]
    store.create_render(rid, {"prompt": "fox", "submitter": who}, tasks)


def test_submitters_share_the_fleet_by_weight_priority_first(store: FarmStore) -> None:
    workers = [f"w{i}" for i in range(1, 7)]
    for w in workers:
        store.register_worker(w, {})
    _render(store, "a1", "ann", 8)  # ann queued first: FIFO alone would give her every worker
    _render(store, "b1", "bob", 8)
    got = [store.lease(w, ["mlx"], 60_000)["render"] for w in ("w1", "w2", "w3", "w4")]
    assert got == ["a1", "b1", "a1", "b1"]
    store.set_policy(**{"weight:bob": "3"})
    for t in ("a1.k0", "a1.k1", "b1.k0", "b1.k1"):
        store.complete(t, store.get_task(t)["worker"], store.get_task(t)["fence"], {}, {})
    _render(store, "c1", "cat", 2)
    store.set_priority("c1", 5)
    got = [store.lease(w, ["mlx"], 60_000)["render"] for w in workers]
    assert got[:2] == ["c1", "c1"]  # priority first
    assert got[2:] == ["a1", "b1", "b1", "b1"]  # then by weight: bob (3) gets three workers to ann's (1) one



def test_a_farm_from_before_the_submitters_set_builds_it_and_stays_fair(store: FarmStore) -> None:
    for w in ("w1", "w2", "w3", "w4"):
        store.register_worker(w, {})
    _render(store, "a1", "ann", 8)
    _render(store, "b1", "bob", 8)
    store.client.delete(store.key("submitters"))  # as a farm whose renders came before the set
    _render(store, "a2", "ann", 8)
    assert store.client.smembers(store.key("submitters")) == {"ann", "bob"}
    got = [store.lease(w, ["mlx"], 60_000)["render"] for w in ("w1", "w2", "w3", "w4")]
    assert got == ["a1", "b1", "a1", "b1"]  # lease.lua still weighs bob against ann

def _needing(rid: str, needs: list[list[str]]) -> list[dict]:
    return [{"id": f"{rid}.k{i}", "kind": "decode_video", "params": {"needs": n}, "inputs": {}, "deps": [],
             "capability": "mlx"} for i, n in enumerate(needs)]


@pytest.mark.parametrize(("affinity", "first"), [("1", "r.k1"), ("0", "r.k0")])
def test_affinity_policy_switch(store: FarmStore, affinity: str, first: str) -> None:
    store.register_worker("w", {})
    store.client.hset(store.key("worker", "w"), "models", '["vae_decoder"]')  # what complete.lua records
    store.set_policy(affinity=affinity)
    store.create_render("r", {"prompt": "fox"}, _needing("r", [["transformer"], ["vae_decoder"]]))
    assert store.lease("w", ["mlx"], 60_000)["id"] == first


def test_bench_affinity_counts_models_a_worker_had_to_load(store: FarmStore) -> None:
    from farm_cli.bench.affinity import model_loads

    store.register_worker("w", {})
    store.create_render("r", {"prompt": "fox"}, _needing("r", [["a"], ["a"], ["b"], ["a"]]))
    for models in (["a"], ["a"], ["a", "b"], ["b", "a"]):
        task = store.lease("w", ["mlx"], 60_000)
        store.complete(task["id"], "w", task["fence"], {}, {"models": models})
        time.sleep(0.002)  # distinct lease times: the count follows lease order
    assert model_loads(store, ["r"], {}) == 2  # a once, then b
    assert model_loads(store, ["r"], {"w": {"a", "b"}}) == 1  # warm from an earlier run, b evicted at once


def test_a_peer_of_another_class_does_not_hold_a_tile_back(store: FarmStore) -> None:
    """Dealing counts only the peers the step's determinism class lets take a tile: a slow worker of the
    class that started the step takes a tile a fast worker of another class could not."""
    for name, ratio, fingerprint in (("slow", 4.0, "A"), ("slow2", 4.0, "A"), ("fast", 1.0, "B")):
        store.register_worker(name, {"fingerprint": fingerprint})
        store.worker_seen(name, "idle", "")
        store.client.hset(store.key("costratio", name), KIND, ratio)
    store.create_render("r", {"prompt": "fox"}, _tiles("r", 3, cost_s=30.0))
    store.set_policy(dealing="0")
    assert store.lease("slow2", ["mlx"], 60_000, seen=True)["id"] == "r.s0.t0"  # class A starts the step
    store.set_policy(dealing="")
    assert store.lease("slow", ["mlx"], 60_000, seen=True)["id"] == "r.s0.t1"  # B's fast worker cannot take it
