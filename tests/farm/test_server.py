"""The coordinator over real gRPC: fencing, result checking, submit/watch/cancel, unreachable coordinators.

These tests act as the worker themselves (raw Lease/Complete/Fail calls with hand-made tasks) to pin the
protocol; real worker subprocesses running the real runner are in test_worker_real.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from coordinator.api.auth import auth_metadata
from coordinator.server import serve, stop
from coordinator.state.redis_server import free_port
from farm_cli.client import CoordinatorUnreachable, FarmClient, FarmError
from protos import farm_pb2, farm_pb2_grpc
from protos.auth import farm_channel
from protos.tensors import encode_tensor
from tests.farm.farm_harness import join_token

TOKEN = "test-token-server"
CAP = "test-cap"


@pytest.fixture
def farm(store, tmp_data: Path) -> Iterator[tuple[str, object, str]]:
    server, port = serve(store, tmp_data, token=TOKEN, lease_ms=1500, expiry_interval_s=0.1)
    yield f"127.0.0.1:{port}", store, join_token(tmp_data, TOKEN)
    stop(server, grace=0)


def _worker_stub(address: str, token: str) -> tuple[grpc.Channel, farm_pb2_grpc.FarmWorkerStub]:
    channel = farm_channel(address, token)
    return channel, farm_pb2_grpc.FarmWorkerStub(channel)


def _lease(stub, worker_id: str, wait_ms: int = 2000) -> farm_pb2.LeaseReply:
    request = farm_pb2.LeaseRequest(worker_id=worker_id, capabilities=[CAP], wait_ms=wait_ms)
    return stub.Lease(request, timeout=wait_ms / 1000 + 5, metadata=auth_metadata(TOKEN))


def _task(task_id: str, kind: str, expect: dict, **extra) -> dict:
    return {
        "id": task_id,
        "kind": kind,
        "capability": CAP,
        "params": {"expect": expect, **extra},
        "inputs": {},
    }


def test_stale_fence_is_refused_over_grpc(farm) -> None:
    address, store, token = farm
    store.create_render("r1", {"frame_rate": 24}, [_task("r1.a", "x", {}), _task("r1.b", "x", {})])
    channel, stub = _worker_stub(address, token)
    md = auth_metadata(TOKEN)
    with channel:
        first = _lease(stub, "w-old")
        assert first.has_task and first.task_id == "r1.a"
        time.sleep(2.0)  # no heartbeat: the lease (1.5 s) expires and the task is re-queued
        second = _lease(stub, "w-new")
        assert second.task_id == "r1.a" and second.fence > first.fence and second.attempts == 2
        beat = farm_pb2.HeartbeatRequest(task_id="r1.a", worker_id="w-old", fence=first.fence)
        assert stub.Heartbeat(beat, timeout=5, metadata=md).status == farm_pb2.STALE
        late = farm_pb2.CompleteRequest(
            task_id="r1.a", worker_id="w-old", fence=first.fence, metrics_json="{}"
        )
        assert stub.Complete(late, timeout=5, metadata=md).status == farm_pb2.STALE
        fail = farm_pb2.FailRequest(task_id="r1.a", worker_id="w-old", fence=first.fence, error="late")
        assert stub.Fail(fail, timeout=5, metadata=md).status == farm_pb2.STALE
        beat.worker_id, beat.fence = "w-new", second.fence
        assert stub.Heartbeat(beat, timeout=5, metadata=md).status == farm_pb2.OK
        good = farm_pb2.CompleteRequest(
            task_id="r1.a", worker_id="w-new", fence=second.fence, metrics_json="{}"
        )
        assert stub.Complete(good, timeout=5, metadata=md).status == farm_pb2.OK
    assert store.get_task("r1.a")["state"] == "done"


def test_result_with_wrong_dtype_or_shape_is_refused_and_requeued(farm) -> None:
    address, store, token = farm
    expect = {"out": {"dtype": "float32", "shape": [2, -1]}}
    store.create_render("r2", {"frame_rate": 24}, [_task("r2.a", "x", expect), _task("r2.b", "x", {})])
    md = auth_metadata(TOKEN)
    channel, stub = _worker_stub(address, token)
    with channel, FarmClient(address, token, timeout=10) as client:
        bad_results = [
            ({"out": client.put_blob(encode_tensor(np.zeros((2, 3), np.float64)))}, "dtype float64"),
            ({"out": client.put_blob(encode_tensor(np.zeros((3, 3), np.float32)))}, "shape [3, 3]"),
            ({"out": "ab" * 32}, "never uploaded"),
            ({}, "missing outputs: out"),
        ]
        for attempt, (outputs, why) in enumerate(bad_results, start=1):
            lease = _lease(stub, "w1")
            assert lease.task_id == "r2.a" and lease.attempts == attempt
            request = farm_pb2.CompleteRequest(
                task_id="r2.a", worker_id="w1", fence=lease.fence, outputs=outputs
            )
            reply = stub.Complete(request, timeout=5, metadata=md)
            if attempt < 3:
                assert reply.status == farm_pb2.REQUEUED, why
                assert why in reply.message
                assert store.get_task("r2.a")["state"] == "queued"
            else:  # max_attempts (3) used up: the refusal fails the task and the render
                assert reply.status == farm_pb2.FAILED
                break
    assert store.get_task("r2.a")["state"] == "failed"
    assert store.get_render("r2")["state"] == "failed"


def test_good_result_commits(farm) -> None:
    address, store, token = farm
    expect = {"out": {"dtype": "float32", "shape": [2, -1]}, "ctx": {"dtype": "float32", "shape": []}}
    store.create_render("r3", {}, [_task("r3.a", "x", expect), _task("r3.b", "x", {})])
    channel, stub = _worker_stub(address, token)
    with channel, FarmClient(address, token, timeout=10) as client:
        sha = client.put_blob(encode_tensor(np.ones((2, 5), np.float32)))
        ctx = client.put_blob(encode_tensor(np.ones((1, 7, 3), np.float32)))  # [] = dtype only
        lease = _lease(stub, "w1")
        request = farm_pb2.CompleteRequest(
            task_id=lease.task_id, worker_id="w1", fence=lease.fence, outputs={"out": sha, "ctx": ctx}
        )
        assert stub.Complete(request, timeout=5, metadata=auth_metadata(TOKEN)).status == farm_pb2.OK
    assert store.get_task("r3.a")["outputs"] == {"out": sha, "ctx": ctx}


def test_unreachable_coordinator_is_one_line(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    with FarmClient(address, join_token(tmp_path, TOKEN), timeout=1.0) as client, pytest.raises(CoordinatorUnreachable) as info:
        client.list()
    message = str(info.value)
    assert address in message and "\n" not in message and "Traceback" not in message


def test_submit_refuses_bad_spec_and_watch_ends_on_cancel(farm, tmp_path: Path) -> None:
    address, store, token = farm
    with FarmClient(address, token, timeout=10) as client:
        with pytest.raises(FarmError) as info:
            client.submit({"prompt": "a cat", "no_such_field": 1})
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and "\n" not in str(info.value)
        assert client.list() == []
        with pytest.raises(FarmError, match="never uploaded"):
            client.submit({"prompt": "a cat", "image": {"blob": "cd" * 32}})
        assert client.list() == []
        render_id = client.submit({"prompt": "a cat", "pack": "tiny"})
        record = client.get(render_id)
        assert record["state"] == "queued" and record["tasks"]
        with pytest.raises(FarmError) as early:
            client.fetch_output(render_id, store_path := tmp_path / "nope.mp4")
        assert early.value.code == grpc.StatusCode.FAILED_PRECONDITION and not store_path.exists()
        assert client.cancel(render_id) is True
        events = list(client.watch(render_id, timeout=20))
        assert events and events[-1]["type"] == "render_cancelled"
        assert [r["id"] for r in client.list()] == [render_id]


def test_only_recently_seen_workers_shape_validation(store) -> None:
    from coordinator.api.client_servicer import live_fleet

    store.register_worker("gone", {"packs": ["tiny"], "memory_bytes": 1 << 30})
    store.register_worker("here", {"packs": ["tiny"], "memory_bytes": 1 << 34})
    assert sorted(w["memory_bytes"] for w in live_fleet(store)) == [1 << 30, 1 << 34]
    store.client.hset(store.key("worker", "gone"), "last_seen_ms", 0)  # last heard from long ago
    assert [w["memory_bytes"] for w in live_fleet(store)] == [1 << 34]


def test_a_stopped_coordinator_leaves_no_threads_behind(store, tmp_data: Path) -> None:
    """Its handler pool and every loop end with it: a process that runs coordinators one after another (a
    standby's host, the test suite) does not grow a thread per past RPC."""
    import threading

    def ours() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("farm-")}

    before = ours()
    server, port = serve(store, tmp_data, token=TOKEN, lease_ms=1500, expiry_interval_s=0.1)
    address, token = f"127.0.0.1:{port}", join_token(tmp_data, TOKEN)
    channel, stub = _worker_stub(address, token)
    replies = [_lease(stub, f"w{i}", wait_ms=200) for i in range(3)]  # handler threads, then idle
    channel.close()
    assert not any(r.has_task for r in replies)
    assert len(ours() - before) > 0, "a serving coordinator runs handler threads and its loops"
    stop(server, grace=0)
    deadline = time.monotonic() + 10
    while ours() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not ours() - before, sorted(t.name for t in ours() - before)
