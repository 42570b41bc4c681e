"""Specs that cannot render, ids that are not ids and registrations of the wrong type are refused where
they enter, in one line, with nothing written to Redis. Real coordinator over TLS gRPC, real Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from coordinator.api.auth import auth_metadata, load_or_create_token
from coordinator.server import serve, stop
from farm_cli.client import FarmClient, FarmError
from protos import farm_pb2, farm_pb2_grpc
from protos.auth import farm_channel

GOOD = {"prompt": "a fox", "pack": "tiny"}
BAD_SPECS = {
    "frame_rate 1e300": {"frame_rate": 1e300},
    "frame_rate inf": {"frame_rate": float("inf")},
    "frame_rate nan": {"frame_rate": float("nan")},
    "frame_rate 0": {"frame_rate": 0},
    "prompt not text": {"prompt": 5},
    "prompt a list": {"prompt": ["a", "b"]},
    "sigmas with nan": {"stage2_sigmas": [float("nan"), 0.0]},
    "sigmas rising": {"stage2_sigmas": [0.4, 0.7, 0.0]},
    "sigmas not ending at 0": {"stage2_sigmas": [0.9, 0.5]},
    "seed beyond 2^63": {"seed": 2**64},
    "seed a bool": {"seed": True},
    "height text": {"height": "tall"},
    "unknown field": {"colour": "red"},
    "image blob not a sha": {"image": {"blob": "../../x", "frame": 0, "strength": 1.0}},
    "group with a colon": {"group": "g:1"},
    "chunk carry not shorter than the window": {"chunked": True, "frames": 49, "chunk_pixel_frames": 17,
                                                "chunk_carry_frames": 17},
    "chunk window not 8k+1": {"chunked": True, "frames": 49, "chunk_pixel_frames": 20},
    "chunked on a recipe that does not chunk": {"chunked": True, "frames": 121, "pipeline": "two-stage"},
    "chunked within one window": {"chunked": True, "frames": 25},
}


@pytest.fixture
def coordinator(store, tmp_data: Path, tiny_packs: Path) -> Iterator[tuple[str, str]]:
    (tmp_data / "packs").symlink_to(tiny_packs)
    token = load_or_create_token(tmp_data)
    server, port = serve(store, tmp_data, token=token)
    yield f"127.0.0.1:{port}", token
    stop(server, grace=0)


@pytest.mark.timeout(60)
def test_specs_that_cannot_render_are_refused_in_one_line_and_nothing_is_queued(coordinator, store) -> None:
    address, token = coordinator
    with FarmClient(address, token, timeout=10) as client:
        for name, bad in BAD_SPECS.items():
            with pytest.raises(FarmError) as refused:
                client.submit({**GOOD, **bad})
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT, name
            assert "\n" not in str(refused.value) and str(refused.value), name
        assert client.list() == [] and not store.client.keys(f"{store.prefix}:render:*")
        assert client.submit(GOOD)  # the same coordinator takes a good one


@pytest.mark.timeout(60)
def test_a_chunked_clip_whose_windows_outgrow_the_data_folder_is_refused_with_the_size(coordinator, store,
                                                                                       tmp_data) -> None:
    """65,529 frames at 1536x1024: its windows' decoded frames need ~1.3 TB, more than this machine's data
    folder has free; the next size down that fits is taken."""
    import shutil

    from coordinator.plan.chunks import held_frame_bytes
    from coordinator.plan.render import normalize_spec

    big = {**GOOD, "chunked": True, "frames": 65529, "height": 1024, "width": 1536}
    need = held_frame_bytes(normalize_spec(big))
    assert need > shutil.disk_usage(tmp_data).free  # the case is real here, not assumed
    address, token = coordinator
    with FarmClient(address, token, timeout=10) as client:
        with pytest.raises(FarmError) as refused:
            client.submit(big)
        line = str(refused.value)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and "\n" not in line
        assert f"need {need / 1e9:.1f} GB in the coordinator's data folder" in line and "-f 65529" in line, line
        assert client.list() == []
        assert client.submit({**GOOD, "chunked": True, "frames": 121, "height": 64, "width": 128})


@pytest.mark.timeout(60)
def test_deep_or_huge_json_is_refused_without_a_recursion_error(coordinator) -> None:
    address, token = coordinator
    with farm_channel(address, token) as channel:
        stub, md = farm_pb2_grpc.FarmClientStub(channel), auth_metadata(token)
        for text in ('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}", '{"prompt": "' + "x" * 300_000 + '"}',
                     "[1, 2]", "{not json"):
            with pytest.raises(grpc.RpcError) as refused:
                stub.Submit(farm_pb2.SubmitRequest(spec_json=text), timeout=10, metadata=md)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, text[:40]
            assert "\n" not in refused.value.details()


@pytest.mark.timeout(60)
def test_ids_that_are_not_ids_are_refused_and_never_stored(coordinator, store) -> None:
    address, token = coordinator
    with farm_channel(address, token) as channel:
        client, worker = farm_pb2_grpc.FarmClientStub(channel), farm_pb2_grpc.FarmWorkerStub(channel)
        md = auth_metadata(token)
        calls = [
            lambda: client.GetRender(farm_pb2.RenderRequest(render_id="x:tasks"), timeout=5, metadata=md),
            lambda: client.Cancel(farm_pb2.RenderRequest(render_id="a b"), timeout=5, metadata=md),
            lambda: worker.Lease(farm_pb2.LeaseRequest(worker_id="", wait_ms=0), timeout=5, metadata=md),
            lambda: worker.Lease(farm_pb2.LeaseRequest(worker_id="w:1", wait_ms=0), timeout=5, metadata=md),
            lambda: worker.Register(farm_pb2.WorkerInfo(worker_id="w" * 100_000), timeout=5, metadata=md),
            lambda: worker.Heartbeat(farm_pb2.HeartbeatRequest(worker_id="w1", task_id="t:x"), timeout=5,
                                     metadata=md),
        ]
        for i, call in enumerate(calls):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, i
    assert store.list_workers() == []


@pytest.mark.timeout(60)
def test_a_registration_of_the_wrong_shape_is_refused_and_submits_go_on(coordinator, store) -> None:
    address, token = coordinator
    with farm_channel(address, token) as channel:
        worker, md = farm_pb2_grpc.FarmWorkerStub(channel), auth_metadata(token)
        for caps in ({"packs": 5}, {"memory_bytes": "lots"}, {"pack_components": {"tiny": 3}}, ["x"]):
            with pytest.raises(grpc.RpcError) as refused:
                worker.Register(farm_pb2.WorkerInfo(worker_id="mac-1", capabilities_json=json.dumps(caps)),
                                timeout=5, metadata=md)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caps
        with pytest.raises(grpc.RpcError) as refused:
            worker.Heartbeat(farm_pb2.HeartbeatRequest(worker_id="mac-1", task_id="t1", progress_json="[1]"),
                             timeout=5, metadata=md)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert store.list_workers() == []
    with FarmClient(address, token, timeout=10) as client:
        assert client.submit(GOOD)


@pytest.mark.timeout(60)
def test_a_submit_below_the_disk_floor_is_refused_and_nothing_is_queued(coordinator, store, monkeypatch) -> None:
    address, token = coordinator
    monkeypatch.setenv("FARM_MIN_FREE_GB", "1e12")  # a floor no test machine's disk reaches
    with FarmClient(address, token, timeout=10) as client:
        with pytest.raises(FarmError) as refused:
            client.submit(GOOD)
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "FARM_MIN_FREE_GB" in str(refused.value)
        assert client.list() == []
        monkeypatch.setenv("FARM_MIN_FREE_GB", "0")
        assert client.submit(GOOD)
