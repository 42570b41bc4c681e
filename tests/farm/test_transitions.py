"""Cheap transitions over the real coordinator: the next lease rides on Complete, a worker's liveness and
drain mark come with its own calls, and a wake rouses one waiting lease poll, not all of them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.api.auth import auth_metadata
from coordinator.scheduler import Scheduler
from coordinator.server import serve, stop
from coordinator.state.blobs import BlobStore
from coordinator.state.store import FarmStore
from protos import farm_pb2, farm_pb2_grpc
from protos.auth import farm_channel
from tests.farm.farm_harness import join_token

TOKEN = "test-token-transitions"
CAP = "test-cap"


def _tasks(rid: str, n: int) -> list[dict]:
    """n tasks, and one no worker here serves, so the render never finishes (no assembly)."""
    return [{"id": f"{rid}.t{i}", "kind": "x", "capability": CAP, "params": {"expect": {}}, "inputs": {}}
            for i in range(n)] + [{"id": f"{rid}.hold", "kind": "x", "capability": "other", "params": {}, "inputs": {}}]


@pytest.fixture
def worker(store, tmp_data: Path) -> Iterator[tuple[farm_pb2_grpc.FarmWorkerStub, FarmStore]]:
    server, port = serve(store, tmp_data, token=TOKEN, lease_ms=30_000)
    channel = farm_channel(f"127.0.0.1:{port}", join_token(tmp_data, TOKEN))
    stub = farm_pb2_grpc.FarmWorkerStub(channel)
    stub.Register(farm_pb2.WorkerInfo(worker_id="w1", capabilities_json="{}"), timeout=10,
                  metadata=auth_metadata(TOKEN))
    yield stub, store
    channel.close()
    stop(server, grace=0)


def _call(method, request):
    return method(request, timeout=10, metadata=auth_metadata(TOKEN))


def test_complete_carries_the_next_lease_and_the_worker_is_seen_by_its_own_calls(worker) -> None:
    stub, store = worker
    store.create_render("r", {}, _tasks("r", 2))
    ask = farm_pb2.LeaseRequest(worker_id="w1", capabilities=[CAP])
    first = _call(stub.Lease, ask)
    assert first.has_task and first.task_id == "r.t0"
    seen = store.list_workers()[0]
    assert (seen["state"], seen["current_task"]) == ("busy", "r.t0")

    reply = _call(stub.Complete, farm_pb2.CompleteRequest(task_id="r.t0", worker_id="w1", fence=first.fence, next=ask))
    assert reply.status == farm_pb2.OK and reply.next.has_task and reply.next.task_id == "r.t1"
    assert reply.next.fence > first.fence and store.get_task("r.t1")["worker"] == "w1"
    assert store.list_workers()[0]["current_task"] == "r.t1"

    last = _call(stub.Complete, farm_pb2.CompleteRequest(task_id="r.t1", worker_id="w1", fence=reply.next.fence,
                                                         next=ask))
    assert last.status == farm_pb2.OK and not last.next.has_task and not last.next.drain
    assert store.list_workers()[0]["state"] == "idle"
    # A result sent again (its reply was lost) is refused, and asks for nothing it was not given.
    again = _call(stub.Complete, farm_pb2.CompleteRequest(task_id="r.t1", worker_id="w1", fence=reply.next.fence))
    assert again.status == farm_pb2.STALE and not again.HasField("next")


def test_a_draining_worker_hears_it_from_its_heartbeat_and_gets_no_next_task(worker) -> None:
    stub, store = worker
    store.create_render("r", {}, _tasks("r", 2))
    ask = farm_pb2.LeaseRequest(worker_id="w1", capabilities=[CAP])
    lease = _call(stub.Lease, ask)
    beat = farm_pb2.HeartbeatRequest(task_id=lease.task_id, worker_id="w1", fence=lease.fence)
    assert not _call(stub.Heartbeat, beat).drain
    assert store.drain_worker("w1")
    heard = _call(stub.Heartbeat, beat)
    assert heard.status == farm_pb2.OK and heard.drain

    done = _call(stub.Complete, farm_pb2.CompleteRequest(task_id=lease.task_id, worker_id="w1", fence=lease.fence,
                                                         next=ask))
    assert done.status == farm_pb2.OK and done.next.drain and not done.next.has_task
    assert store.get_task("r.t1")["state"] == "queued"  # left for the others
    assert store.list_workers()[0]["state"] == "drained"



def test_a_result_and_the_next_lease_are_one_lua_call_and_a_refused_one_still_gets_its_next(redis_client,
                                                                                               tmp_data: Path) -> None:
    store = ScriptCountingStore(redis_client, "one")
    server, port = serve(store, tmp_data, token=TOKEN, lease_ms=30_000)
    channel = farm_channel(f"127.0.0.1:{port}", join_token(tmp_data, TOKEN))
    try:
        stub = farm_pb2_grpc.FarmWorkerStub(channel)
        _call(stub.Register, farm_pb2.WorkerInfo(worker_id="w1", capabilities_json="{}"))
        tasks = _tasks("r", 3)
        tasks[1]["params"] = {"expect": {"video": {"dtype": "float32"}}}  # r.t1 must send an output
        store.create_render("r", {}, tasks)
        ask = farm_pb2.LeaseRequest(worker_id="w1", capabilities=[CAP])
        first = _call(stub.Lease, ask)
        store.calls.clear()
        done = _call(stub.Complete, farm_pb2.CompleteRequest(task_id="r.t0", worker_id="w1", fence=first.fence,
                                                             next=ask))
        assert done.status == farm_pb2.OK and done.next.task_id == "r.t1"
        assert store.calls == ["complete_lease"]
        refused = _call(stub.Complete, farm_pb2.CompleteRequest(task_id="r.t1", worker_id="w1", fence=done.next.fence,
                                                                next=ask))
        assert refused.status == farm_pb2.REQUEUED and "missing outputs: video" in refused.message
        assert refused.next.has_task and refused.next.task_id == "r.t1"  # back at the front of the queue
        stale = _call(stub.Complete, farm_pb2.CompleteRequest(task_id="r.t1", worker_id="w1", fence=done.next.fence,
                                                              next=ask))
        assert stale.status == farm_pb2.STALE and stale.next.task_id == "r.t2"
        assert store.get_task("r.t1")["worker"] == "w1" and store.get_task("r.t2")["state"] == "leased"
    finally:
        channel.close()
        stop(server, grace=0)


class ScriptCountingStore(FarmStore):
    """The real store, naming each Lua script it runs for worker w1 (the coordinator leases under its own id)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def _run(self, name: str, *args):
        if "w1" in args:
            self.calls.append(name)
        return super()._run(name, *args)

class CountingStore(FarmStore):
    """The real store, counting lease attempts (each one Lua call)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.leases = 0

    def lease(self, *args, **kwargs):
        self.leases += 1
        return super().lease(*args, **kwargs)


def _wait_for(check, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)


def test_a_wake_rouses_one_waiting_lease_and_a_lease_that_got_work_passes_it_on(redis_client, tmp_data: Path) -> None:
    store = CountingStore(redis_client, "wake")
    # No fallback poll within the test (poll_s far above it): only wakes make a waiting lease ask again.
    scheduler = Scheduler(store, BlobStore(tmp_data, store), tmp_data, poll_s=60.0)
    got: dict[str, str | None] = {}
    pollers = [threading.Thread(target=lambda w=f"w{i}": got.__setitem__(w, (scheduler.lease(w, [CAP], 30_000)
                                                                            or {}).get("id")))
               for i in range(5)]
    for t in pollers:
        t.start()
    _wait_for(lambda: store.leases == 5 and sum(map(len, scheduler._waiting.values())) == 5)

    store.create_render("r", {}, _tasks("r", 1))
    scheduler.wake()
    _wait_for(lambda: len(got) == 1)
    time.sleep(0.3)  # room for any other poll a wake-all would have set off
    # the woken poll leased it and passed the wake on once (that poll found nothing): 2 Lua calls, not 5
    assert store.leases == 7 and list(got.values()) == ["r.t0"]

    store.add_tasks("r", [{"id": "r.more0", "kind": "x", "capability": CAP, "params": {}, "inputs": {}},
                          {"id": "r.more1", "kind": "x", "capability": CAP, "params": {}, "inputs": {}}])
    scheduler.wake()  # one wake; the poll that leases passes it on, so both tasks go
    _wait_for(lambda: len(got) == 3)
    assert sorted(v for v in got.values() if v) == ["r.more0", "r.more1", "r.t0"]

    scheduler.stop()
    for t in pollers:
        t.join(10)
    assert not any(t.is_alive() for t in pollers) and len(got) == 5
