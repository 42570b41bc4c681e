"""A worker's prefetcher fetches the inputs of the very task its next lease hands it: the coordinator's
Upcoming guess is the lease's own choice (lease.lua's rules), so a queue whose head this worker may not
take does not send it fetching another task's blobs. Timing-free: the lease is held back until the
prefetch has reported, then what it requested is compared with the lease's inputs. Real Redis, the
real coordinator over gRPC, the worker's own Prefetcher."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.api.auth import auth_metadata, load_or_create_token
from coordinator.server import serve, stop
from protos import farm_pb2, farm_pb2_grpc
from protos.auth import farm_channel
from worker.prefetch import Prefetcher

pytestmark = pytest.mark.timeout(60)
SHA = {name: name[0] * 64 for name in ("alpha", "beta", "cache", "delta")}


def _task(tid: str, needs: list[str], inputs: dict[str, str]) -> dict:
    return {"id": tid, "kind": "transformer_forward", "params": {"pack": "tiny", "needs": needs},
            "inputs": {name: {"blob": SHA[blob]} for name, blob in inputs.items()}, "deps": [], "capability": "mlx"}


@pytest.fixture
def worker(store, tmp_data: Path) -> Iterator[tuple[farm_pb2_grpc.FarmWorkerStub, list]]:
    """A stub of the real coordinator, with worker w1 registered holding only the tiny pack's transformer."""
    token = load_or_create_token(tmp_data)
    server, port = serve(store, tmp_data, token=token)
    try:
        with farm_channel(f"127.0.0.1:{port}", token) as channel:
            stub, md = farm_pb2_grpc.FarmWorkerStub(channel), list(auth_metadata(token))
            caps = {"pack_components": {"tiny": ["transformer"]}}
            stub.Register(farm_pb2.WorkerInfo(worker_id="w1", capabilities_json=json.dumps(caps)), timeout=10,
                          metadata=md)
            yield stub, md
    finally:
        stop(server, grace=0)


def test_the_prefetch_fetches_the_inputs_of_the_task_the_next_lease_hands_over(store, worker) -> None:
    stub, md = worker
    # First in queue order: a task w1 cannot take (it lacks the upscaler); then a tile it can.
    store.create_render("a", {"prompt": "x"}, [_task("a.up", ["spatial_upscaler"], {"latent": "alpha"})])
    store.create_render("b", {"prompt": "x"}, [_task("b.t0", ["transformer"], {"latent": "beta", "text": "cache"}),
                                               _task("b.t1", ["transformer"], {"latent": "delta", "text": "cache"})])
    requested: list[str] = []
    prefetch = Prefetcher(lambda request: stub.Upcoming(request, timeout=10, metadata=md), requested.append,
                          lambda sha: False)
    ask = farm_pb2.LeaseRequest(worker_id="w1", capabilities=["mlx"])
    prefetch.start(ask)
    assert prefetch.wait(30)  # the lease is held back until the prefetch has reported
    lease = stub.Lease(farm_pb2.LeaseRequest(worker_id="w1", capabilities=["mlx"], wait_ms=0), timeout=10,
                       metadata=md)
    assert lease.has_task and lease.task_id == "b.t0"
    assert sorted(requested) == sorted(set(lease.inputs.values())) == sorted([SHA["beta"], SHA["cache"]])
    assert store.get_task("a.up")["state"] == "queued"  # the guess leased and moved nothing


def test_a_task_guessed_for_another_worker_is_stepped_over(store, worker) -> None:
    """Two busy workers warm for two different tiles; w1's lease then takes the one it warmed for once
    the other worker has leased its own."""
    stub, md = worker
    store.register_worker("w2", {"pack_components": {"tiny": ["transformer"]}})
    store.create_render("b", {"prompt": "x"}, [_task("b.t0", ["transformer"], {"latent": "beta"}),
                                               _task("b.t1", ["transformer"], {"latent": "delta"})])
    told = {w: list(stub.Upcoming(farm_pb2.LeaseRequest(worker_id=w, capabilities=["mlx"]), timeout=10,
                                  metadata=md).shas) for w in ("w2", "w1")}
    assert told == {"w2": [SHA["beta"]], "w1": [SHA["delta"]]}
    assert store.lease("w2", ["mlx"], 10_000)["id"] == "b.t0"
    assert dict(stub.Lease(farm_pb2.LeaseRequest(worker_id="w1", capabilities=["mlx"], wait_ms=0), timeout=10,
                           metadata=md).inputs) == {"latent": SHA["delta"]}


def test_a_lease_settling_mid_prefetch_waits_for_every_blob_of_the_guess(store, worker) -> None:
    """The lease arrives while the prefetch still moves the tile's first blob: settle waits for the second
    one as well (all of a guess's blobs are in flight at once), so the task finds both in the cache."""
    stub, md = worker
    store.create_render("b", {"prompt": "x"}, [_task("b.t0", ["transformer"], {"latent": "beta", "text": "cache"})])
    cache: set[str] = set()
    gates = {SHA["beta"]: threading.Event(), SHA["cache"]: threading.Event()}
    first, started = threading.Event(), []

    def fetch(sha: str) -> None:
        started.append(sha)
        first.set()
        assert gates[sha].wait(30)
        cache.add(sha)

    prefetch = Prefetcher(lambda request: stub.Upcoming(request, timeout=10, metadata=md), fetch, cache.__contains__)
    prefetch.start(farm_pb2.LeaseRequest(worker_id="w1", capabilities=["mlx"]))
    assert first.wait(30)  # one blob is being fetched, the other not yet
    lease = stub.Lease(farm_pb2.LeaseRequest(worker_id="w1", capabilities=["mlx"], wait_ms=0), timeout=10, metadata=md)
    settling = threading.Thread(target=prefetch.settle, args=(list(lease.inputs.values()),))
    settling.start()
    gates[started[0]].set()  # the first blob lands; the second is still held back
    settling.join(1.0)
    assert settling.is_alive()  # still waiting for the second blob (a quick return would find it missing)
    for gate in gates.values():
        gate.set()
    settling.join(30)
    assert not settling.is_alive() and cache >= set(lease.inputs.values())
