"""Nothing fresh is lost: `farm prune --older-than 0` keeps a blob uploaded seconds
ago for a submit on its way; a PutBlob the client cuts mid-stream costs one log line, not an ERROR with a
traceback; and an old leader that lost its epoch publishes no file (reducer blobs, assembly outputs)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from coordinator.assemble.assembler import assemble_streaming
from coordinator.leadership import check_epoch
from coordinator.server import serve, stop
from coordinator.state.store import FarmStore, NotLeader
from farm_cli.client import FarmClient
from protos.auth import auth_metadata, farm_channel
from protos.blobwire import WIRE_CHUNK_BYTES, BlobStub, Chunk
from tests.farm.farm_harness import join_token

SECRET = "test-token-fresh"


@pytest.fixture
def coordinator(store, tmp_data: Path) -> Iterator[tuple[str, str]]:
    server, port = serve(store, tmp_data, token=SECRET, expiry_interval_s=0.2)
    yield f"127.0.0.1:{port}", join_token(tmp_data, SECRET)
    stop(server, grace=0)


@pytest.mark.timeout(60)
def test_prune_older_than_0_keeps_a_blob_uploaded_seconds_ago(coordinator, store) -> None:
    address, token = coordinator
    with FarmClient(address, token, timeout=30) as client:
        image = client.put_blob(b"an image on its way to a submit")
        done = client.prune(0)
        assert done["blobs"] == 0
        assert store.get_blob_ref(image) is not None
        assert client.get_blob(image) == b"an image on its way to a submit"


def _cut_upload(address: str, token: str, data: Path) -> None:
    """A PutBlob that sends one chunk, then is cancelled by its client (a laptop closed mid-upload)."""
    sent = threading.Event()

    def chunks() -> Iterator[Chunk]:
        yield Chunk(memoryview(b"x" * WIRE_CHUNK_BYTES), "", 0)
        sent.set()
        time.sleep(30)  # never finishes: the client cancels first

    with farm_channel(address, token) as channel:
        future = BlobStub(channel)._put.future(chunks(), timeout=20, metadata=auth_metadata(token))
        assert sent.wait(10)
        deadline = time.monotonic() + 10  # the chunk is on the coordinator's disk, in a temp file
        while not list((data / "blobs" / "tmp").glob("*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        future.cancel()
        with pytest.raises(grpc.FutureCancelledError):
            future.result()


@pytest.mark.timeout(60)
def test_a_put_blob_cut_mid_stream_logs_one_line_without_a_traceback(coordinator, caplog, tmp_data: Path) -> None:
    address, token = coordinator
    caplog.set_level(logging.INFO)
    _cut_upload(address, token, tmp_data)
    deadline = time.monotonic() + 10
    while not any("cut off" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # anything grpc logs after the handler returned
    cut = [r for r in caplog.records if "cut off" in r.getMessage()]
    assert len(cut) == 1 and cut[0].levelno == logging.INFO, [r.getMessage() for r in caplog.records]
    loud = [r for r in caplog.records if (r.levelno >= logging.ERROR or r.exc_info)
            and r.name.split(".")[0] in ("coordinator", "grpc", "protos")]
    assert loud == [], [(r.name, r.getMessage()) for r in loud]


def _deposed(store: FarmStore) -> FarmStore:
    """The store as an old leader holds it: its epoch is set, but the lease in Redis carries a newer one."""
    store.client.hset(store.key("leader"), mapping={"epoch": "8"})
    old = FarmStore(store.client)
    old.epoch = "7"
    return old


@pytest.mark.timeout(60)
def test_an_old_leaders_assembly_and_reducer_outputs_are_fenced(store, tmp_data: Path) -> None:
    spec = {"height": 32, "width": 32, "frames": 3, "frame_rate": 24.0}
    frames = np.zeros((3, 32, 32, 3), np.float32)
    get = lambda name, output: frames if (name, output) == ("decode", "frames") else None  # noqa: E731
    out = tmp_data / "renders" / "r1"
    first = assemble_streaming(spec, get, out, fence=lambda: check_epoch(store))  # unfenced store: publishes
    assert first == out / "render.mp4"
    written = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(written) == ["render.json", "render.mp4"]

    old = _deposed(store)
    with pytest.raises(NotLeader):
        check_epoch(old)
    with pytest.raises(NotLeader):  # the woken old leader assembles again: nothing of it takes the files' place
        assemble_streaming(spec, lambda n, o: frames[::-1] if (n, o) == ("decode", "frames") else None, out,
                           fence=lambda: check_epoch(old))
    assert (out / "render.mp4").read_bytes() == written["render.mp4"]
    assert (out / "render.json").read_bytes() == written["render.json"]
    store.epoch = "8"
    check_epoch(store)  # the new leader's own epoch passes


@pytest.mark.timeout(60)
def test_a_reducer_that_lost_its_epoch_writes_no_blob_and_logs_one_line(store, tmp_data: Path, caplog,
                                                                        monkeypatch) -> None:
    import coordinator.reduce.reducer as reducer_module
    from coordinator.state.blobs import BlobStore

    old = _deposed(store)
    reducer = reducer_module.ReducerThread(old, BlobStore(tmp_data, old), scheduler=None)
    monkeypatch.setattr(reducer_module, "run_reduce_task", lambda kind, params, inputs: {"out": np.ones(4, np.float32)})
    task = {"id": "r1.blend", "kind": "blend", "params": {}, "inputs": {}, "render": "r1", "fence": 1}
    with pytest.raises(NotLeader):
        reducer._compute(task)
    assert [p for p in (tmp_data / "blobs").rglob("*") if p.is_file()] == []
    caplog.set_level(logging.INFO)
    for _ in range(3):  # every pass of its loop meets the refusal again: one line says so
        reducer.deposed.note(NotLeader("not the leader (epoch 7 is over)"))
    lines = [r for r in caplog.records if "lost its epoch" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING and not lines[0].exc_info
