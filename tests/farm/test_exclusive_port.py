"""The coordinator binds its port exclusively (grpc.so_reuseport off): a second server on a port in use
fails to bind instead of sharing it and answering clients at random. `farm up` / `farm coordinator` on a
busy port say so in one line with exit 2 (tests/farm/test_cli_services.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.api.auth import load_or_create_token
from coordinator.server import serve, stop
from farm_cli.client import FarmClient


@pytest.mark.timeout(60)
def test_a_second_server_on_the_same_port_cannot_bind(store, tmp_data: Path, tmp_path: Path) -> None:
    token = load_or_create_token(tmp_data)
    server, port = serve(store, tmp_data, token=token)
    try:
        other = tmp_path / "other"
        other.mkdir()
        with pytest.raises(RuntimeError, match=f"bind to address 127.0.0.1:{port}"):  # grpcio's words
            serve(store, other, port=port, token=load_or_create_token(other))
        with FarmClient(f"127.0.0.1:{port}", token, timeout=10) as client:
            assert client.list() == []  # the first one still answers, with its own farm's CA
    finally:
        stop(server, grace=0)
