"""The bulk data channel (protos.bulkwire, coordinator.api.bulk_server) against a real coordinator: blobs
round-trip over TLS and plain TCP with the same checks as gRPC; corrupt, cut, misnamed or unsigned
transfers are refused with one line and leave nothing behind; a worker falls back to gRPC."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coordinator.server import serve, stop
from protos import bulkclient as bc
from protos import bulkwire as bw
from protos import farm_pb2, farm_pb2_grpc
from protos.auth import auth_metadata, farm_channel, fetch_ca
from tests.farm.farm_harness import ROOT, join_token
from worker.blobcache import BlobCache
from worker.connection import Coordinators
from worker.transfer import BlobTransfer

pytestmark = pytest.mark.timeout(120)

SECRET = "test-secret-bulk"
MIB = 1024 * 1024


class Farm:
    def __init__(self, server, address: str, token: str, data: Path) -> None:
        self.server, self.address, self.token, self.data = server, address, token, data
        self.bulk = server.bulk

    def endpoint(self, port: int | None = None) -> bc.Endpoint:
        ca = fetch_ca(self.address, bw_fingerprint(self.token)) if self.bulk.tls else None
        return bc.Endpoint("127.0.0.1", port or self.bulk.port, ca)

    def transfer(self, cache: Path, port: int | None = None) -> BlobTransfer:
        moved = BlobTransfer(
            Coordinators(self.address, self.token),
            list(auth_metadata(self.token)),
            BlobCache(cache),
            threading.Event(),
        )
        moved.announce(self.address, port or self.bulk.port, self.bulk.tls is not None)
        return moved

    def stored(self) -> list[Path]:
        return [p for p in (self.data / "blobs").rglob("*") if p.is_file()]


def bw_fingerprint(token: str) -> str:
    return token.split(".")[1]


@pytest.fixture(params=["tls", "plain"])
def farm(request, store, tmp_data: Path) -> Iterator[Farm]:
    server, port = serve(store, tmp_data, token=SECRET, bulk_plain=request.param == "plain")
    yield Farm(server, f"127.0.0.1:{port}", join_token(tmp_data, SECRET), tmp_data)
    stop(server, grace=0)


@pytest.fixture
def plain_farm(store, tmp_data: Path) -> Iterator[Farm]:
    server, port = serve(store, tmp_data, token=SECRET, bulk_plain=True)
    yield Farm(server, f"127.0.0.1:{port}", join_token(tmp_data, SECRET), tmp_data)
    stop(server, grace=0)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def nothing_in_flight(farm: Farm, connections: int | None = None) -> bool:
    """No temp file and no open connection; with `connections`, also every connection the test made
    was accepted: a cut sender hears no reply, so only the server's count says it was seen at all."""
    accepted = connections is None or farm.bulk.connections >= connections
    return accepted and farm.bulk.open == 0 and not any((farm.data / "blobs" / "tmp").iterdir())


def test_round_trip_over_tls_and_plain(farm: Farm, store, tmp_path: Path) -> None:
    data = os.urandom(9 * MIB + 12345)  # several blocks and a ragged end
    sha = hashlib.sha256(data).hexdigest()
    moved = farm.transfer(tmp_path / "cache")
    assert moved.put_blob(data) == sha  # put_blob raises DataChannelFailed, never falls back itself
    assert (farm.data / "blobs" / sha[:2] / sha[2:]).read_bytes() == data
    assert store.get_blob_ref(sha)["size"] == len(data)
    assert bc.get(farm.endpoint(), SECRET, sha) == data
    assert moved.fetch_blob(sha)[:] == data  # received into a map of the cache file
    assert (tmp_path / "cache" / sha[:2] / sha[2:]).read_bytes() == data
    assert not list((tmp_path / "cache").rglob(".tmp-*"))
    empty = hashlib.sha256(b"").hexdigest()
    assert bc.put(farm.endpoint(), SECRET, b"") == empty
    assert bc.get(farm.endpoint(), SECRET, empty) == b""
    known = os.urandom(3 * MIB)  # the sha named in the header, no trailer
    assert (
        bc.put(farm.endpoint(), SECRET, known, sha=hashlib.sha256(known).hexdigest())
        == hashlib.sha256(known).hexdigest()
    )


def test_registration_announces_the_data_channel(farm: Farm) -> None:
    with farm_channel(farm.address, farm.token) as channel:
        reply = farm_pb2_grpc.FarmWorkerStub(channel).Register(
            farm_pb2.WorkerInfo(worker_id="w1", capabilities_json="{}"),
            timeout=10,
            metadata=auth_metadata(SECRET),
        )
    assert reply.bulk_port == farm.bulk.port and reply.bulk_tls == (farm.bulk.tls is not None)


def _refusal(farm: Farm, header: bytes, body: bytes = b"") -> bw.BulkRefused:
    with bc.connect(farm.endpoint()) as sock:
        sock.sendall(header + body)
        with pytest.raises(bw.BulkRefused) as info:
            bw.read_status(sock)
    return info.value


def test_tickets_are_checked_before_any_byte_lands(farm: Farm) -> None:
    data = os.urandom(MIB)
    sha, other = hashlib.sha256(data).hexdigest(), hashlib.sha256(b"other").hexdigest()
    with pytest.raises(bw.BulkRefused) as wrong_key:  # the client sends it all, then hears the one line
        bc.put(farm.endpoint(), "not-the-secret", data)
    assert wrong_key.value.code == bw.BAD_TICKET and "\n" not in str(wrong_key.value)
    expired = bw.encode_header(SECRET, bw.PUT, sha, len(data), int(time.time()) - 5)
    assert _refusal(farm, expired, data).code == bw.EXPIRED
    far = bw.encode_header(SECRET, bw.PUT, sha, len(data), int(time.time()) + 10 * bw.MAX_AHEAD_S)
    assert _refusal(farm, far, data).code == bw.EXPIRED
    for_other = bytearray(bw.encode_header(SECRET, bw.PUT, other, len(data), int(time.time()) + 60))
    for_other[6:70] = sha.encode()  # the ticket signs another blob's name
    assert _refusal(farm, bytes(for_other), data).code == bw.BAD_TICKET
    get_other = bytearray(bw.encode_header(SECRET, bw.GET, other, 0, int(time.time()) + 60))
    get_other[6:70] = sha.encode()
    assert _refusal(farm, bytes(get_other)).code == bw.BAD_TICKET
    with pytest.raises(bw.BulkRefused) as get_key:
        bc.get(farm.endpoint(), "not-the-secret", sha)
    assert get_key.value.code == bw.BAD_TICKET
    assert farm.stored() == []
    wait_until(lambda: nothing_in_flight(farm), "temp files left")


def test_trailer_ticket_binds_the_name(plain_farm: Farm) -> None:
    """A PUT whose sha follows the bytes: the trailer's own ticket must sign that sha."""
    farm, data = plain_farm, os.urandom(MIB)
    sha, expiry = hashlib.sha256(data).hexdigest(), int(time.time()) + 60
    header = bw.encode_header(SECRET, bw.PUT, "", len(data), expiry)
    forged = bw.encode_trailer("not-the-secret", sha, len(data), expiry)
    assert _refusal(farm, header, data + forged).code == bw.BAD_TICKET
    assert farm.stored() == []
    wait_until(lambda: nothing_in_flight(farm), "temp files left")


def test_wrong_declared_hash_and_missing_blob(farm: Farm) -> None:
    data = os.urandom(3 * MIB + 7)
    lie = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(bw.BulkRefused) as info:
        bc.put(farm.endpoint(), SECRET, data, sha=lie)
    assert info.value.code == bw.MISMATCH and "mismatch" in str(info.value)
    with pytest.raises(bw.BulkRefused) as missing:
        bc.get(farm.endpoint(), SECRET, "ab" * 32)
    assert missing.value.code == bw.NOT_FOUND
    with pytest.raises(bw.BulkRefused) as bad_name:
        bc.get(farm.endpoint(), SECRET, "../../etc/passwd".ljust(64, "x"))
    assert bad_name.value.code == bw.BAD_REQUEST
    assert farm.stored() == []
    wait_until(lambda: nothing_in_flight(farm), "temp files left")


class Proxy:
    """A TCP relay in front of the plain data channel that damages its first connection: `flip` flips
    the byte at that offset of what the client sends; `cut` closes after that many bytes of the reply."""

    def __init__(self, upstream: int, flip: int | None = None, cut: int | None = None) -> None:
        self.upstream, self.flip, self.cut = upstream, flip, cut
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            first = self.connections == 1
            server = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(
                target=self._pump, args=(client, server, self.flip if first else None, None), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(server, client, None, self.cut if first else None), daemon=True
            ).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, flip: int | None, cut: int | None) -> None:
        seen = 0
        try:
            while True:
                data = bytearray(src.recv(1 << 20))
                if not data:
                    break
                if flip is not None and seen <= flip < seen + len(data):
                    data[flip - seen] ^= 0x01
                if cut is not None and seen + len(data) >= cut:
                    dst.sendall(data[: cut - seen])
                    break
                seen += len(data)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


def test_flipped_byte_is_refused_and_the_worker_retries(plain_farm: Farm, tmp_path: Path) -> None:
    farm, data = plain_farm, os.urandom(6 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    proxy = Proxy(farm.bulk.port, flip=3 * MIB)
    try:
        with pytest.raises(bw.BulkRefused) as info:
            bc.put(farm.endpoint(proxy.port), SECRET, data)
        assert info.value.code == bw.MISMATCH and info.value.again
        assert farm.stored() == []
        wait_until(lambda: nothing_in_flight(farm), "temp files left")
        proxy.connections = 0  # the agent's upload: its first attempt is damaged, the retry lands
        assert farm.transfer(tmp_path / "cache", port=proxy.port).upload({"out": data}) == {"out": sha}
        assert proxy.connections == 1
    finally:
        proxy.close()
    assert [p.name for p in farm.stored()] == [sha[2:]]


def test_truncated_streams_keep_nothing(plain_farm: Farm, tmp_path: Path) -> None:
    farm, data = plain_farm, os.urandom(8 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    before = farm.bulk.connections
    with bc.connect(farm.endpoint()) as sock:  # the client closes early
        sock.sendall(
            bw.encode_header(SECRET, bw.PUT, sha, len(data), int(time.time()) + 60) + data[: 3 * MIB]
        )
    wait_until(lambda: nothing_in_flight(farm, before + 1), "the cut put left a temp file")
    assert farm.stored() == []
    assert bc.put(farm.endpoint(), SECRET, data) == sha
    proxy = Proxy(farm.bulk.port, cut=5 * MIB)  # the server's reply is cut short
    cache = tmp_path / "cache"
    try:
        with BlobCache(cache).landing(sha) as land, pytest.raises(bw.BulkRefused) as info:
            bc.get(farm.endpoint(proxy.port), SECRET, sha, land)
        assert info.value.code == bw.TRUNCATED
        assert not list(cache.rglob("*.tmp-*")) and not list(cache.rglob(".tmp-*"))
        proxy.connections = 0
        assert farm.transfer(cache, port=proxy.port).fetch_blob(sha) == data  # cut, then over gRPC
        assert proxy.connections == 1
    finally:
        proxy.close()
    assert not list(cache.rglob(".tmp-*")) and (cache / sha[:2] / sha[2:]).read_bytes() == data


def test_a_cut_put_is_off_disk_before_its_connection_is_released(
    plain_farm: Farm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order, not the timing: when the server releases a cut PUT's connection (the count a
    watcher reads), its temp file is already gone; a file seen then is a file the count let slip."""
    farm, data = plain_farm, os.urandom(4 * MIB)
    tmp, seen = farm.data / "blobs" / "tmp", []
    release = farm.bulk._release

    def observed(raw: socket.socket) -> None:
        seen.append(sorted(p.name for p in tmp.iterdir()))
        release(raw)

    monkeypatch.setattr(farm.bulk, "_release", observed)
    before = farm.bulk.connections
    for n, cut in enumerate((0, MIB, 3 * MIB), 1):  # before the body, in the first block, mid-body
        with bc.connect(farm.endpoint()) as sock:  # one at a time: another's temp file is not this one's
            sock.sendall(bw.encode_header(SECRET, bw.PUT, hashlib.sha256(data).hexdigest(), len(data),
                                          int(time.time()) + 60) + data[:cut])
        wait_until(lambda n=n: len(seen) == n, "a cut connection was never released")
    assert farm.bulk.connections == before + 3 and farm.bulk.open == 0
    assert seen == [[], [], []] and farm.stored() == []


_KILLED_SENDER = """
import sys, time
from protos import bulkclient as bc
from protos import bulkwire as bw
host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
secret = sys.stdin.readline().strip()
sock = bc.connect(bc.Endpoint(host, port, None))
sock.sendall(bw.encode_header(secret, bw.PUT, "", size, int(time.time()) + 60))
sock.sendall(b"x" * (size // 4))
print("sent", flush=True)
time.sleep(600)
"""


def test_kill_9_mid_put_keeps_nothing_and_the_coordinator_serves_on(plain_farm: Farm) -> None:
    farm = plain_farm
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_SENDER, "127.0.0.1", str(farm.bulk.port), str(64 * MIB)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        proc.stdin.write(SECRET + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "sent"
        wait_until(lambda: any((farm.data / "blobs" / "tmp").iterdir()), "the put never started")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_until(lambda: nothing_in_flight(farm), "the killed put left a temp file")
    assert farm.stored() == []
    data = os.urandom(2 * MIB)
    assert bc.put(farm.endpoint(), SECRET, data) == hashlib.sha256(data).hexdigest()


def test_without_a_data_channel_the_worker_uses_grpc(store, tmp_data: Path, tmp_path: Path) -> None:
    server, port = serve(store, tmp_data, token=SECRET, bulk_port=None)
    try:
        address, token = f"127.0.0.1:{port}", join_token(tmp_data, SECRET)
        assert server.bulk is None
        with farm_channel(address, token) as channel:
            reply = farm_pb2_grpc.FarmWorkerStub(channel).Register(
                farm_pb2.WorkerInfo(worker_id="w1", capabilities_json="{}"),
                timeout=10,
                metadata=auth_metadata(SECRET),
            )
        assert reply.bulk_port == 0
        moved = BlobTransfer(
            Coordinators(address, token),
            list(auth_metadata(token)),
            BlobCache(tmp_path / "c"),
            threading.Event(),
        )
        moved.announce(address, reply.bulk_port, reply.bulk_tls)
        data = os.urandom(3 * MIB)
        sha = moved.put_blob(data)
        assert sha == hashlib.sha256(data).hexdigest() and moved.fetch_blob(sha) == data
    finally:
        stop(server, grace=0)


def test_a_standby_refuses_with_the_leaders_address_and_serves_once_it_leads(
    redis_url, tmp_data: Path
) -> None:
    from coordinator.state.redis_server import connect
    from coordinator.state.store import FarmStore
    from protos.endpoints import leader_hint

    # A 3 s lease: a host that stalls this process for a second must not hand the lead to the standby early.
    lead, lead_port = serve(FarmStore(connect(redis_url)), tmp_data, token=SECRET, leader_lease_ms=3000)
    standby, _ = serve(FarmStore(connect(redis_url)), tmp_data, token=SECRET, leader_lease_ms=3000)
    try:
        ca = fetch_ca(f"127.0.0.1:{lead_port}", bw_fingerprint(join_token(tmp_data, SECRET)))
        at_standby = bc.Endpoint("127.0.0.1", standby.bulk.port, ca)
        data = os.urandom(MIB)
        with pytest.raises(bw.BulkRefused) as info:
            bc.put(at_standby, SECRET, data)
        assert info.value.code == bw.UNAVAILABLE and info.value.again
        assert leader_hint(str(info.value)) == f"127.0.0.1:{lead_port}"
        sha = bc.put(bc.Endpoint("127.0.0.1", lead.bulk.port, ca), SECRET, data)
        stop(lead)  # hands the lease back: the standby leads at its next claim
        wait_until(standby.leadership.is_serving, "the standby never took over")
        assert bc.get(at_standby, SECRET, sha) == data  # the shared data folder's blob
    finally:  # both, whatever failed: a coordinator left leading would take the lead in the tests after
        stop(lead)
        stop(standby)


def test_a_rotated_token_signs_the_tickets_from_then_on(store, tmp_data: Path) -> None:
    from coordinator.api.auth import load_or_create_token, rotate_token
    from protos.auth import JoinToken

    old = load_or_create_token(tmp_data)  # DATA/token: the data channel follows it, as gRPC does
    server, port = serve(store, tmp_data, token=old)
    try:
        farm = Farm(server, f"127.0.0.1:{port}", old, tmp_data)
        data = os.urandom(MIB)
        assert bc.put(farm.endpoint(), JoinToken.parse(old).secret, data) == hashlib.sha256(data).hexdigest()
        new = JoinToken.parse(rotate_token(tmp_data)).secret
        wait_until(
            lambda: _refused(lambda: bc.put(farm.endpoint(), JoinToken.parse(old).secret, data)),
            "the old secret still signs",
        )
        assert bc.put(farm.endpoint(), new, data) == hashlib.sha256(data).hexdigest()
    finally:
        stop(server, grace=0)


def _refused(call: Callable[[], object]) -> bool:
    try:
        call()
    except bw.BulkRefused as exc:
        return exc.code == bw.BAD_TICKET
    return False


def test_where_the_disk_cannot_be_reserved_a_put_goes_through_the_ring(plain_farm: Farm) -> None:
    """A coordinator without posix_fallocate (macOS) receives into reusable buffers and writes from them."""
    farm = plain_farm
    farm.bulk.blobs.land = lambda size: None  # this coordinator's store only
    data = os.urandom(9 * MIB + 3)
    assert bc.put(farm.endpoint(), SECRET, data) == hashlib.sha256(data).hexdigest()
    lie = hashlib.sha256(b"other").hexdigest()
    with pytest.raises(bw.BulkRefused) as info:
        bc.put(farm.endpoint(), SECRET, data[:-1], sha=lie)
    assert info.value.code == bw.MISMATCH
    assert [p.read_bytes() for p in farm.stored()] == [data]
    wait_until(lambda: nothing_in_flight(farm), "temp files left")


# --- kept connections (keep-alive): one connection carries request after request ---


def test_several_blobs_over_one_connection(farm: Farm, tmp_path: Path) -> None:
    pool, blobs = bc.Pool(), [os.urandom(n) for n in (0, 1, 300_000, 3 * MIB + 5)]
    shas = [bc.put(farm.endpoint(), SECRET, b, pool=pool) for b in blobs]
    shas.append(bc.put(farm.endpoint(), SECRET, blobs[1], sha=shas[1], pool=pool))  # sha in the header
    assert [bc.get(farm.endpoint(), SECRET, s, pool=pool) for s in shas] == blobs + blobs[1:2]
    assert pool.opened == 1 and pool.idle(farm.endpoint()) == 1
    wait_until(lambda: farm.bulk.requests == 2 * len(shas), "requests not counted")  # after the reply
    assert farm.bulk.connections == 1
    moved = farm.transfer(tmp_path / "cache")  # the agent's path: the process pool
    before = farm.bulk.connections
    outputs = {f"o{i}": os.urandom(200_000 + i) for i in range(5)}
    uploaded = moved.upload(outputs)
    assert all(moved.fetch_blob(uploaded[k])[:] == v for k, v in outputs.items())
    assert farm.bulk.connections == before + 1


@pytest.mark.parametrize("noticed", [True, False], ids=["seen-closed", "found-closed-on-use"])
def test_a_kept_connection_the_server_closed_is_replaced(farm: Farm, monkeypatch, noticed: bool) -> None:
    """Seen closed when taken from the pool, or (a close racing the request) its header goes out and
    the status read meets EOF or a reset: the request goes again, once, on a new connection."""
    pool, data = bc.Pool(), os.urandom(MIB)
    farm.bulk.idle_s = 0.2
    sha = bc.put(farm.endpoint(), SECRET, data, pool=pool)
    wait_until(lambda: not farm.bulk._open, "the server kept the idle connection")
    if not noticed:
        monkeypatch.setattr(bc, "_looks_open", lambda sock: True)
    assert bc.get(farm.endpoint(), SECRET, sha, pool=pool) == data
    wait_until(lambda: not farm.bulk._open, "the server kept the idle connection")
    assert bc.put(farm.endpoint(), SECRET, data, pool=pool) == sha
    wait_until(lambda: farm.bulk.requests == 3, "requests not counted")  # counted after the reply
    assert pool.opened == 3 and farm.bulk.connections == 3


def test_a_refused_or_cut_request_never_reuses_its_connection(plain_farm: Farm, tmp_path: Path) -> None:
    farm, pool, data = plain_farm, bc.Pool(), os.urandom(6 * MIB)
    sha = bc.put(farm.endpoint(), SECRET, data, pool=pool)
    with pytest.raises(bw.BulkRefused) as info:  # refused: the connection is closed at both ends
        bc.put(farm.endpoint(), SECRET, data[:-1], sha=sha, pool=pool)
    assert info.value.code == bw.MISMATCH and pool.idle(farm.endpoint()) == 0
    with pytest.raises(bw.BulkRefused):
        bc.get(farm.endpoint(), SECRET, "ab" * 32, pool=pool)
    assert pool.idle(farm.endpoint()) == 0 and pool.opened == 2  # the refused put's was the first
    assert bc.get(farm.endpoint(), SECRET, sha, pool=pool) == data
    assert pool.opened == 3 and farm.bulk.connections == 3
    proxy = Proxy(farm.bulk.port, cut=3 * MIB)  # cut mid-blob: never back in the pool
    try:
        at = farm.endpoint(proxy.port)
        with pytest.raises(bw.BulkRefused) as cut:
            bc.get(at, SECRET, sha, pool=pool)
        assert cut.value.code == bw.TRUNCATED and pool.idle(at) == 0
        assert bc.get(at, SECRET, sha, pool=pool) == data
        assert bc.get(at, SECRET, sha, pool=pool) == data
        assert proxy.connections == 2 and pool.idle(at) == 1
    finally:
        proxy.close()


def test_concurrent_fetches_each_get_their_own_connection(farm: Farm) -> None:
    pool, blobs = bc.Pool(), [os.urandom(100_000 + i) for i in range(4)]
    shas = [bc.put(farm.endpoint(), SECRET, b, pool=bc.Pool()) for b in blobs]
    for _ in range(2):  # the second round reuses the four kept connections
        together = threading.Barrier(len(shas), timeout=30)  # passed only with all four held at once

        def into(size: int, together=together) -> bytearray:
            together.wait()
            return bytearray(size)

        got: dict[str, object] = {}

        def fetch(sha: str, into=into, got=got) -> None:
            got[sha] = bc.get(farm.endpoint(), SECRET, sha, into, pool=pool)

        threads = [threading.Thread(target=fetch, args=(s,)) for s in shas]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert [got[s] for s in shas] == blobs
        assert pool.opened == 4 and pool.idle(farm.endpoint()) == 4
    assert farm.bulk.connections == 4 + len(shas)  # the four puts' own pools, one each


def test_another_version_is_refused_in_one_line_and_closed(farm: Farm) -> None:
    """A worker or coordinator of version 1 (one request per connection) meets this one: a one-line
    refusal and a close, never a hang; the worker then moves the blob over gRPC."""
    old = bytearray(bw.encode_header(SECRET, bw.GET, "ab" * 32, 0, int(time.time()) + 60))
    old[4] = 1
    with bc.connect(farm.endpoint()) as sock:
        sock.sendall(bytes(old))
        with pytest.raises(bw.BulkRefused) as info:
            bw.read_status(sock)
        assert info.value.code == bw.BAD_REQUEST
        assert sock.recv(1) == b""


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_redis_away_mid_put_is_refused_in_one_line_and_the_channel_lives(tmp_path: Path) -> None:
    from coordinator.state.redis_server import EmbeddedRedis, connect
    from coordinator.state.store import FarmStore

    data = tmp_path / "data"
    data.mkdir()
    with EmbeddedRedis(tmp_path / "redis", persistence=False) as redis:
        server, port = serve(FarmStore(connect(redis.url), "bulk-outage"), data, token=SECRET, bulk_plain=True)
        try:
            end = bc.Endpoint("127.0.0.1", server.bulk.port, None)
            first = os.urandom(MIB)
            assert bc.put(end, SECRET, first) == hashlib.sha256(first).hexdigest()
            redis.stop()  # the blob's record cannot be written now
            with pytest.raises(bw.BulkRefused) as refused:
                bc.put(end, SECRET, os.urandom(MIB))
            assert refused.value.code == bw.UNAVAILABLE and refused.value.again
            assert "\n" not in str(refused.value)
            assert bc.get(end, SECRET, hashlib.sha256(first).hexdigest()) == first  # stored blobs still go out
        finally:
            stop(server, grace=0)
