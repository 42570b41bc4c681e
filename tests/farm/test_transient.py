"""RPCs that meet a Redis outage end UNAVAILABLE (which workers and clients retry), not UNKNOWN (which
they take as a refusal), and the coordinator logs one line when the outage starts and one when it ends."""

from __future__ import annotations

import hashlib
import logging

import grpc
import pytest

from coordinator.api.auth import auth_metadata, load_or_create_token
from coordinator.server import serve, stop
from coordinator.state.redis_server import EmbeddedRedis, connect, free_port
from coordinator.state.store import FarmStore
from protos import farm_pb2, farm_pb2_grpc
from protos.auth import farm_channel


def _put(blobs, data: bytes, md) -> str:
    sha = hashlib.sha256(data).hexdigest()
    return blobs.PutBlob(iter([farm_pb2.BlobChunk(sha256=sha, data=data)]), timeout=10, metadata=md).sha256


@pytest.mark.timeout(60)
def test_rpcs_during_a_redis_outage_answer_unavailable_and_log_once(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="coordinator")
    redis = EmbeddedRedis(tmp_path / "redis", unix_socket=False, port=free_port()).start()
    store = FarmStore(connect(redis.url))
    token = load_or_create_token(tmp_path / "data")
    server, port = serve(store, tmp_path / "data", "127.0.0.1", 0, token, expiry_interval_s=0.2)
    channel = farm_channel(f"127.0.0.1:{port}", token)
    md = auth_metadata(token)
    blobs, worker = farm_pb2_grpc.FarmBlobsStub(channel), farm_pb2_grpc.FarmWorkerStub(channel)
    try:
        redis.proc.kill()
        redis.proc.wait(5)
        codes = []
        for i in range(3):
            try:
                _put(blobs, f"blob {i}".encode(), md)
            except grpc.RpcError as exc:
                codes.append(exc.code())
            try:
                worker.Lease(farm_pb2.LeaseRequest(worker_id="w", capabilities=["mlx"], wait_ms=0), timeout=10,
                             metadata=md)
            except grpc.RpcError as exc:
                codes.append(exc.code())
        redis.start()
        assert _put(blobs, b"after", md) == hashlib.sha256(b"after").hexdigest()
    finally:
        channel.close()
        stop(server)
        redis.stop()
    assert codes == [grpc.StatusCode.UNAVAILABLE] * 6
    rpc_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rpc: ")]
    assert len(rpc_lines) == 2, rpc_lines  # "rpc: ... retrying until it is back", "rpc: back after ..."
    assert "retrying until it is back" in rpc_lines[0] and rpc_lines[1].startswith("rpc: back after")
