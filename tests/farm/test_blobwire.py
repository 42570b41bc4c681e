"""The blob wire (protos.blobwire) over a real gRPC server and the coordinator's blob store: hashed while
streaming at both ends, refused when corrupt, truncated, misnamed or cut off by a killed sender."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from coordinator.api.blob_servicer import FarmBlobsServicer
from coordinator.state.blobs import BlobStore
from protos import farm_pb2, farm_pb2_grpc
from protos.blobwire import (
    WIRE_CHUNK_BYTES,
    BlobStub,
    Chunk,
    WireError,
    add_blob_service,
    decode_chunk,
    encode_chunk,
    receive_into_buffer,
    send_chunks,
)
from tests.farm.farm_harness import ROOT
from worker.blobcache import BlobCache

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def blob_server(store, tmp_data: Path) -> Iterator[tuple[str, BlobStore]]:
    """A real gRPC server carrying only the FarmBlobs service, on loopback."""
    server = grpc.server(futures.ThreadPoolExecutor(4), options=[("grpc.max_receive_message_length", 4 << 20)])
    blobs = BlobStore(tmp_data, store)
    servicer = FarmBlobsServicer(blobs)
    add_blob_service(server, servicer.PutBlob, servicer.GetBlob)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", blobs
    server.stop(0)


def _kept(data_dir: Path) -> list[Path]:
    return [p for p in (data_dir / "blobs").rglob("*") if p.is_file()]


def test_codec_reads_and_writes_the_generated_message() -> None:
    data = os.urandom(3000)
    ours = encode_chunk(Chunk(memoryview(data), "ab" * 32, 99))
    theirs = farm_pb2.BlobChunk.FromString(ours)
    assert (theirs.sha256, theirs.data, theirs.size) == ("ab" * 32, data, 99)
    back = decode_chunk(farm_pb2.BlobChunk(data=data, sha256="cd" * 32).SerializeToString())
    assert (bytes(back.data), back.sha256, back.size) == (data, "cd" * 32, 0)
    with pytest.raises(WireError):
        decode_chunk(ours[:-5])


def test_put_names_the_blob_last_and_generated_stubs_still_interoperate(blob_server, store) -> None:
    address, blobs = blob_server
    data = os.urandom(2 * WIRE_CHUNK_BYTES + 777)
    sha = hashlib.sha256(data).hexdigest()
    with grpc.insecure_channel(address) as channel:
        assert BlobStub(channel).put(data, timeout=30) == sha  # sha256 computed while streaming
        assert blobs.read(sha) == data and store.get_blob_ref(sha)["size"] == len(data)
        chunks = list(farm_pb2_grpc.FarmBlobsStub(channel).GetBlob(farm_pb2.BlobRequest(sha256=sha), timeout=30))
        assert b"".join(c.data for c in chunks) == data
        assert chunks[0].sha256 == sha and chunks[0].size == len(data) and len(chunks) == 3
        assert bytes(receive_into_buffer(BlobStub(channel).get(sha, timeout=30), sha)) == data


def _put_raw(address: str, chunks: list[Chunk]) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_unary("/ltxfarm.v1.FarmBlobs/PutBlob", request_serializer=encode_chunk,
                                    response_deserializer=bytes)
        with pytest.raises(grpc.RpcError) as info:
            call(iter(chunks), timeout=30)
    return info.value.code()


def test_corrupt_truncated_and_misnamed_puts_keep_nothing(blob_server, store, tmp_data: Path) -> None:
    address, _ = blob_server
    data = bytearray(os.urandom(3 * 1024 * 1024))
    sha = hashlib.sha256(data).hexdigest()
    good = list(send_chunks(bytes(data), chunk_bytes=1 << 20))
    assert good[-1].sha256 == sha and not len(good[-1].data)
    flipped = bytearray(good[1].data)
    flipped[100] ^= 1
    corrupt = [good[0], Chunk(memoryview(bytes(flipped))), *good[2:]]
    assert _put_raw(address, corrupt) == grpc.StatusCode.DATA_LOSS
    assert _put_raw(address, [good[0], *good[2:]]) == grpc.StatusCode.DATA_LOSS  # a chunk missing
    assert _put_raw(address, good[:-1]) == grpc.StatusCode.INVALID_ARGUMENT  # never named
    assert _put_raw(address, [Chunk(memoryview(b"x"), "../../etc/passwd")]) == grpc.StatusCode.INVALID_ARGUMENT
    assert _kept(tmp_data) == [] and store.get_blob_ref(sha) is None


def test_a_get_that_is_truncated_or_corrupt_is_refused_and_not_cached(tmp_path: Path) -> None:
    data = os.urandom(5000)
    sha = hashlib.sha256(data).hexdigest()
    cache = BlobCache(tmp_path / "cache")
    whole = list(send_chunks(data, sha, chunk_bytes=1000))
    cases = {"truncated": whole[:-1], "corrupt": [*whole[:2], Chunk(memoryview(os.urandom(1000))), *whole[3:]]}
    for why, chunks in cases.items():
        with pytest.raises(WireError, match=why), cache.writer(sha) as keep:
            receive_into_buffer(iter(chunks), sha, keep)
        assert cache.get(sha) is None
    with cache.writer(sha) as keep:
        assert bytes(receive_into_buffer(iter(whole), sha, keep)) == data
    assert cache.get(sha) == data
    assert not [p for p in (tmp_path / "cache").rglob(".tmp-*")]


SLOW_SENDER = """
import sys, time, grpc
from protos.blobwire import BlobStub, send_chunks
def slow():
    for chunk in send_chunks(b"z" * (64 << 20), chunk_bytes=1 << 20):
        yield chunk
        print("sent", flush=True)
        time.sleep(0.05)
with grpc.insecure_channel(sys.argv[1]) as ch:
    BlobStub(ch)._put(slow(), timeout=60)
"""


def test_a_sender_killed_mid_put_leaves_no_blob_and_no_temp_file(blob_server, store, tmp_data: Path) -> None:
    address, _ = blob_server
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SENDER, address], cwd=ROOT, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    for _ in range(5):  # a few chunks are on the coordinator's disk, in a temp file
        assert proc.stdout.readline()
    assert list((tmp_data / "blobs" / "tmp").iterdir())
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 20
    while list((tmp_data / "blobs" / "tmp").iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _kept(tmp_data) == []
    assert store.get_blob_ref(hashlib.sha256(b"z" * (64 << 20)).hexdigest()) is None
