"""Blobs: streamed in ~1 MiB chunks, verified on arrival at both ends, content-addressed on disk."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from coordinator.api.auth import auth_metadata
from coordinator.server import serve, stop
from coordinator.state.blobs import BlobError, BlobMismatch, BlobStore
from farm_cli.client import BlobCorrupt, FarmClient, FarmError, blob_chunks, receive_blob
from protos import farm_pb2, farm_pb2_grpc
from protos.auth import farm_channel
from protos.blobwire import WIRE_CHUNK_BYTES
from protos.tensors import CHUNK_BYTES, encode_tensor
from tests.farm.farm_harness import join_token
from worker.blobcache import BlobCache

TOKEN = "test-token-blobs"


@pytest.fixture
def coordinator(store, tmp_data: Path) -> Iterator[tuple[str, str]]:
    server, port = serve(store, tmp_data, token=TOKEN)
    yield f"127.0.0.1:{port}", join_token(tmp_data, TOKEN)
    stop(server, grace=0)


def _stored_files(data_dir: Path) -> list[Path]:
    return [p for p in (data_dir / "blobs").rglob("*") if p.is_file()]


def test_five_mib_blob_round_trips_in_chunks(coordinator: tuple[str, str], store, tmp_data: Path) -> None:
    coordinator, token = coordinator
    data = os.urandom(5 * CHUNK_BYTES + 12345)
    sha = hashlib.sha256(data).hexdigest()
    with FarmClient(coordinator, token, timeout=30) as client:
        assert client.put_blob(data) == sha
        assert client.get_blob(sha) == data
    path = tmp_data / "blobs" / sha[:2] / sha[2:]
    assert path.read_bytes() == data
    assert store.get_blob_ref(sha)["size"] == len(data)
    with farm_channel(coordinator, token) as channel:
        chunks = list(
            farm_pb2_grpc.FarmBlobsStub(channel).GetBlob(
                farm_pb2.BlobRequest(sha256=sha), timeout=30, metadata=auth_metadata(TOKEN)
            )
        )
    assert len(chunks) == -(-len(data) // WIRE_CHUNK_BYTES)
    assert all(len(c.data) <= WIRE_CHUNK_BYTES for c in chunks)
    assert chunks[0].sha256 == sha


def test_wrong_sha256_is_refused_and_nothing_kept(coordinator: tuple[str, str], store, tmp_data: Path) -> None:
    coordinator, token = coordinator
    data = os.urandom(2 * CHUNK_BYTES + 7)
    lie = hashlib.sha256(b"something else").hexdigest()
    with farm_channel(coordinator, token) as channel:
        stub = farm_pb2_grpc.FarmBlobsStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.PutBlob(blob_chunks(data, lie), timeout=30, metadata=auth_metadata(TOKEN))
    assert info.value.code() == grpc.StatusCode.DATA_LOSS
    assert _stored_files(tmp_data) == []
    assert store.get_blob_ref(lie) is None
    assert store.get_blob_ref(hashlib.sha256(data).hexdigest()) is None


def test_bad_names_and_missing_blobs(coordinator: tuple[str, str]) -> None:
    coordinator, token = coordinator
    with farm_channel(coordinator, token) as channel:
        stub = farm_pb2_grpc.FarmBlobsStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.PutBlob(
                iter([farm_pb2.BlobChunk(sha256="../../etc/x", data=b"x")]),
                timeout=5,
                metadata=auth_metadata(TOKEN),
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with FarmClient(coordinator, token, timeout=5) as client, pytest.raises(FarmError) as missing:
        client.get_blob("ab" * 32)
    assert missing.value.code == grpc.StatusCode.NOT_FOUND


def test_client_refuses_a_stream_that_does_not_hash() -> None:
    data = b"payload" * 1000
    sha = hashlib.sha256(data).hexdigest()
    assert receive_blob(blob_chunks(data, sha), sha) == data
    with pytest.raises(BlobCorrupt):
        receive_blob(blob_chunks(data + b"!", sha), sha)


def test_blobstore_header_and_size_checks(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path)
    sha = blobs.put_bytes(encode_tensor(np.zeros((2, 3), np.float32)))
    assert blobs.header(sha)[:2] == ("float32", (2, 3))
    np.testing.assert_array_equal(blobs.read_tensor(sha), np.zeros((2, 3), np.float32))
    raw = blobs.put_bytes(b"not a tensor")
    with pytest.raises(BlobError):
        blobs.header(raw)
    truncated = blobs.put_bytes(encode_tensor(np.zeros((4,), np.float32))[:-4])
    with pytest.raises(BlobError, match="payload size"):
        blobs.header(truncated)
    with pytest.raises(BlobMismatch):
        blobs.put_stream("0" * 64, [b"abc"])
    assert not any((tmp_path / "blobs" / "tmp").iterdir())


def test_worker_cache_verifies_and_evicts(tmp_path: Path) -> None:
    cache = BlobCache(tmp_path / "cache", max_bytes=250)
    blobs = [os.urandom(100) for _ in range(3)]
    shas = [hashlib.sha256(b).hexdigest() for b in blobs]
    with pytest.raises(ValueError):
        cache.put(shas[0], blobs[1])
    cache.put(shas[0], blobs[0])
    assert cache.get(shas[0]) == blobs[0]
    (tmp_path / "cache" / shas[0][:2] / shas[0][2:]).write_bytes(b"corrupt")
    assert cache.get(shas[0]) is None  # corrupt file is dropped, not served
    for sha, data in zip(shas, blobs, strict=True):
        time.sleep(0.02)  # distinct mtimes: eviction is least-recently-used by mtime
        cache.put(sha, data)
    kept = [sha for sha in shas if cache.get(sha) is not None]
    assert len(kept) == 2 and shas[-1] in kept


def test_worker_cache_drops_partial_writes_a_killed_worker_left(tmp_path: Path) -> None:
    """A `.tmp-` file untouched for 10 minutes has no writer left (kill -9 mid-fetch): the next worker on
    that cache removes it; a fresh one (a fetch in flight in another process) is left alone."""
    folder = tmp_path / "cache" / "ab"
    folder.mkdir(parents=True)
    stale, fresh = folder / ".tmp-stale", folder / ".tmp-fresh"
    stale.write_bytes(os.urandom(1000))
    fresh.write_bytes(os.urandom(1000))
    old = time.time() - 601
    os.utime(stale, (old, old))
    BlobCache(tmp_path / "cache")
    assert not stale.exists() and fresh.exists()
