"""TLS with a pinned join token, against real servers on 127.0.0.1: a worker given only the token
joins; a client whose token names another CA refuses before its secret leaves; plaintext is refused."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.api.auth import load_or_create_token
from coordinator.api.tls import load_or_create_tls
from coordinator.server import serve, stop
from farm_cli.client import FarmClient, FarmError
from protos.auth import NOT_THIS_FARM, JoinToken
from tests.farm.farm_harness import ROOT


@pytest.fixture
def coordinator(store, tmp_data: Path) -> Iterator[tuple[str, str]]:
    token = load_or_create_token(tmp_data)
    server, port = serve(store, tmp_data, token=token)
    yield f"127.0.0.1:{port}", token
    stop(server, grace=0)


class Impostor:
    """A real TLS listener with another farm's certificate that records every byte a client sends."""

    def __init__(self, chain_pem: bytes, key_pem: bytes, folder: Path) -> None:
        (folder / "chain.pem").write_bytes(chain_pem)
        (folder / "key.pem").write_bytes(key_pem)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(folder / "chain.pem", folder / "key.pem")
        self.context.set_alpn_protocols(["h2"])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.received = bytearray()
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            threading.Thread(target=self._read, args=(raw,), daemon=True).start()

    def _read(self, raw: socket.socket) -> None:
        raw.settimeout(2)
        try:
            with self.context.wrap_socket(raw, server_side=True) as tls:
                while data := tls.recv(65536):
                    self.received += data
        except (OSError, ssl.SSLError):
            pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.listener.close()


def _impostor(tmp_path: Path, ca_pem: bytes | None = None) -> Impostor:
    other = load_or_create_tls(tmp_path / "other-farm")
    chain = other.chain_pem if ca_pem is None else other.chain_pem + ca_pem  # + the real (public) CA
    return Impostor(chain, other.server_key_pem, tmp_path)


@pytest.mark.timeout(60)
def test_a_token_for_another_ca_never_sends_its_secret(tmp_path: Path) -> None:
    token = load_or_create_token(tmp_path / "farm")
    impostor = _impostor(tmp_path)
    try:
        with FarmClient(impostor.address, token, timeout=5) as client, pytest.raises(FarmError) as info:
            client.list()
        assert NOT_THIS_FARM in str(info.value) and "\n" not in str(info.value)
        assert impostor.connections >= 1  # it did reach the impostor, and looked
        assert JoinToken.parse(token).secret.encode() not in impostor.received
    finally:
        impostor.close()


@pytest.mark.timeout(60)
def test_a_server_showing_the_farm_ca_it_does_not_hold_gets_no_secret(tmp_path: Path) -> None:
    """The CA certificate is public: an impostor may send it along, but cannot sign with it."""
    token = load_or_create_token(tmp_path / "farm")
    real_ca = (tmp_path / "farm" / "tls" / "ca.pem").read_bytes()
    impostor = _impostor(tmp_path, real_ca)
    try:
        with FarmClient(impostor.address, token, timeout=5) as client, pytest.raises(FarmError):
            client.list()
        time.sleep(0.3)
        assert JoinToken.parse(token).secret.encode() not in impostor.received
    finally:
        impostor.close()


@pytest.mark.timeout(60)
def test_a_plaintext_client_is_refused(coordinator) -> None:
    address, token = coordinator
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@pytest.mark.timeout(60)
def test_a_coordinator_of_another_farm_is_refused_by_name(store, tmp_data: Path, tmp_path: Path) -> None:
    token = load_or_create_token(tmp_path / "mine")
    server, port = serve(store, tmp_data, token=load_or_create_token(tmp_data))
    try:
        with FarmClient(f"127.0.0.1:{port}", token, timeout=5) as client, pytest.raises(FarmError) as info:
            client.list()
        assert NOT_THIS_FARM in str(info.value)
    finally:
        stop(server, grace=0)


@pytest.mark.timeout(120)
def test_a_worker_given_only_the_join_token_joins(store, coordinator, tiny_packs: Path, tmp_path: Path) -> None:
    """The token in FARM_TOKEN, nothing else: the worker pins the CA, registers, and argv holds no secret."""
    address, token = coordinator
    cmd = [sys.executable, "-m", "worker.agent", "--coordinator", address, "--worker-id", "env-only",
           "--packs-dir", str(tiny_packs), "--cache-dir", str(tmp_path / "cache"), "--wait-ms", "500"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FARM_TOKEN": token}
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(w["id"] == "env-only" for w in store.list_workers()):
            assert proc.poll() is None, "the worker exited"
            time.sleep(0.2)
        assert any(w["id"] == "env-only" for w in store.list_workers())
        args = subprocess.run(["ps", "-o", "args=", "-p", str(proc.pid)], capture_output=True, text=True).stdout
        assert args and JoinToken.parse(token).secret not in args
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.timeout(240)
def test_token_rotate_takes_effect_without_restarting_the_worker(store, tmp_data: Path, tiny_packs: Path) -> None:
    """`farm token rotate`: the old secret is refused within seconds, the worker reading DATA/token keeps
    working (it reads the file again when refused), a render submitted with the new token finishes."""
    from farm_cli.services import worker_command
    from tests.farm.farm_harness import wait_done

    old = load_or_create_token(tmp_data)
    server, port = serve(store, tmp_data, token=old, lease_ms=3000)
    address = f"127.0.0.1:{port}"
    cmd = worker_command(address, tmp_data / "token", tiny_packs, "w1", tmp_data / "cache", wait_ms=500)
    worker = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not store.list_workers() and time.monotonic() < deadline:
            time.sleep(0.2)
        rotated = subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", "token", "rotate",
                                  "--data", str(tmp_data)], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert rotated.returncode == 0, rotated.stderr
        new = (tmp_data / "token").read_text().strip()
        assert new != old and JoinToken.parse(new).fingerprint == JoinToken.parse(old).fingerprint
        time.sleep(1.5)  # the coordinator looks at the file once a second
        with FarmClient(address, old, timeout=5) as client, pytest.raises(FarmError) as refused:
            client.list()
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
        with FarmClient(address, new, timeout=30) as client:
            render_id = client.submit({"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "seed": 5})
            wait_done(client, render_id, timeout=180)
        assert worker.poll() is None  # the same process, never restarted
    finally:
        worker.terminate()
        worker.wait(timeout=20)
        stop(server, grace=0)
