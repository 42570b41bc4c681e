"""The join token: created once with mode 0600, required on every RPC except health; every channel is
TLS, its CA pinned by the token's fingerprint before the secret is sent."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.api.auth import auth_metadata, load_or_create_token
from coordinator.server import serve, stop
from farm_cli.client import FarmClient, FarmError
from protos import farm_pb2, farm_pb2_grpc
from protos.auth import JoinToken, farm_channel


@pytest.fixture
def coordinator(store, tmp_data: Path) -> Iterator[tuple[str, str]]:
    token = load_or_create_token(tmp_data)
    server, port = serve(store, tmp_data, token=token)
    yield f"127.0.0.1:{port}", token
    stop(server, grace=0)


def test_token_created_once_with_private_mode(tmp_path: Path) -> None:
    token = load_or_create_token(tmp_path / "data")
    path = tmp_path / "data" / "token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(JoinToken.parse(token).secret) >= 32 and len(JoinToken.parse(token).fingerprint) == 64
    assert load_or_create_token(tmp_path / "data") == token
    for key in ("ca.key", "server.key"):
        assert stat.S_IMODE((tmp_path / "data" / "tls" / key).stat().st_mode) == 0o600


def _calls(channel: grpc.Channel, metadata) -> dict[str, object]:
    """One call of each streaming shape, so the interceptor is exercised on all four."""
    client = farm_pb2_grpc.FarmClientStub(channel)
    blobs = farm_pb2_grpc.FarmBlobsStub(channel)
    worker = farm_pb2_grpc.FarmWorkerStub(channel)
    kw = {"timeout": 5, "metadata": metadata}
    return {
        "unary": lambda: client.ListRenders(farm_pb2.ListRendersRequest(), **kw),
        "worker": lambda: worker.Lease(farm_pb2.LeaseRequest(worker_id="w", capabilities=["x"]), **kw),
        "server_stream": lambda: list(blobs.GetBlob(farm_pb2.BlobRequest(sha256="0" * 64), **kw)),
        "client_stream": lambda: blobs.PutBlob(iter([farm_pb2.BlobChunk(sha256="0" * 64, data=b"x")]), **kw),
    }


@pytest.mark.parametrize("metadata", [None, auth_metadata("wrong-token"), (("authorization", "wrong"),)])
def test_missing_or_wrong_token_is_unauthenticated(coordinator, metadata) -> None:
    address, token = coordinator
    with farm_channel(address, token) as channel:
        for name, call in _calls(channel, metadata).items():
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, name


def test_unknown_method_without_token_is_unauthenticated(coordinator) -> None:
    address, token = coordinator
    with farm_channel(address, token) as channel:
        call = channel.unary_unary("/ltxfarm.v1.FarmClient/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as info:
            call(b"", timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_health_works_without_token(coordinator) -> None:
    address, token = coordinator
    with farm_channel(address, token) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "ltxfarm.v1.FarmWorker"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_right_token_is_accepted(coordinator) -> None:
    address, token = coordinator
    with FarmClient(address, token, timeout=5) as client:
        assert client.list() == []
    with FarmClient(address, token + "x", timeout=5) as client, pytest.raises(FarmError) as info:
        client.list()
    assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert "\n" not in str(info.value)
