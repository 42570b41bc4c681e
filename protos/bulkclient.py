"""The data channel's client side: connections to a coordinator's data channel, kept and reused, and the
PUT/GET exchanges a worker (or the bench) makes over them. The framing, tickets and checks are
protos.bulkwire's; this module only dials, pools and drives them.
"""

from __future__ import annotations

import hashlib
import mmap
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

from protos.auth import SERVER_NAME
from protos.blobwire import WireError, receive_into_buffer
from protos.bulkwire import (
    GET,
    PUT,
    TICKET_TTL_S,
    TIMEOUT_S,
    TRUNCATED,
    BulkRefused,
    encode_header,
    encode_trailer,
    landed_chunks,
    overlapped_if_big,
    read_status,
    send_view,
)

POOL_IDLE_S = 20.0  # the client reuses a kept connection only this long (well inside IDLE_S)
POOL_SIZE = 8  # idle connections kept per endpoint: a worker fetches 4 at once, prefetches, uploads

@dataclass(frozen=True)
class Endpoint:
    """Where a coordinator serves its data channel; ca_pem None = plain TCP (its operator's choice)."""

    host: str
    port: int
    ca_pem: bytes | None


@lru_cache(maxsize=8)
def client_context(ca_pem: bytes) -> ssl.SSLContext:
    """TLS that trusts only the farm's CA (pinned from the join token) and checks SERVER_NAME."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def connect(endpoint: Endpoint, timeout: float = TIMEOUT_S) -> socket.socket:
    sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if endpoint.ca_pem is None:
        return sock
    try:
        return client_context(endpoint.ca_pem).wrap_socket(sock, server_hostname=SERVER_NAME)
    except BaseException:
        sock.close()
        raise


class Pool:
    """Idle connections kept per endpoint, thread-safe: take() one per request (a kept one that still
    looks open, else a new one), give() it back only after the request ended cleanly. `opened` counts
    the connections made."""

    def __init__(self, size: int = POOL_SIZE, idle_s: float = POOL_IDLE_S) -> None:
        self.size, self.idle_s, self.opened = size, idle_s, 0
        self._idle: dict[Endpoint, list[tuple[float, socket.socket]]] = {}
        self._lock = threading.Lock()

    def take(self, endpoint: Endpoint, timeout: float = TIMEOUT_S) -> tuple[socket.socket, bool]:
        """(connection, reused): the most recently kept one that is young and open, else a new one."""
        while True:
            with self._lock:
                kept = self._idle.get(endpoint)
                since, sock = kept.pop() if kept else (0.0, None)
            if sock is None:
                break
            if time.monotonic() - since < self.idle_s and _looks_open(sock):
                sock.settimeout(timeout)
                return sock, True
            sock.close()
        sock = connect(endpoint, timeout)
        with self._lock:
            self.opened += 1
        return sock, False

    def give(self, endpoint: Endpoint, sock: socket.socket) -> None:
        now, spare = time.monotonic(), [sock]
        with self._lock:
            kept = self._idle.setdefault(endpoint, [])
            young = [(t, s) for t, s in kept if now - t < self.idle_s]
            spare = [s for t, s in kept if now - t >= self.idle_s]
            if len(young) < self.size:
                young.append((now, sock))
            else:
                spare.append(sock)
            kept[:] = young
        for s in spare:
            s.close()

    def idle(self, endpoint: Endpoint) -> int:
        with self._lock:
            return len(self._idle.get(endpoint, ()))

    def clear(self) -> None:
        with self._lock:
            kept, self._idle = self._idle, {}
        for conns in kept.values():
            for _, s in conns:
                s.close()


POOL = Pool()  # the process's pool: the worker's fetch threads, its prefetcher and its uploads share it


def _looks_open(sock: socket.socket) -> bool:
    """False when the peer closed an idle connection (EOF or reset waiting) or sent something unasked.
    Over TLS a readable socket may hold only a session ticket: a non-blocking read then wants more."""
    try:
        if not select.select([sock], [], [], 0)[0]:
            return True
        sock.setblocking(False)
        sock.recv(1)  # b"": closed; a byte: nothing is owed on an idle connection
        return False
    except (ssl.SSLWantReadError, BlockingIOError):
        return True
    except (OSError, ValueError):
        return False


class _Stale(Exception):
    """A kept connection the peer had closed: the request moved nothing the other end kept."""


_PEER_CLOSED = (ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


def _closed_by_peer(exc: BaseException) -> bool:
    return isinstance(exc, _PEER_CLOSED) or (isinstance(exc, BulkRefused) and exc.code == TRUNCATED)


@contextmanager
def _stale_when_peer_closed() -> Iterator[None]:
    """Around a request's exchange up to its status: a peer that had closed the kept connection makes it
    _Stale (retried on a new one); any other failure stays what it is."""
    try:
        yield
    except (OSError, BulkRefused) as exc:
        if _closed_by_peer(exc):
            raise _Stale from exc
        raise


def _exchange(endpoint: Endpoint, timeout: float, pool: Pool, request: Callable[[socket.socket], object]):
    """request(sock) on a connection from pool, given back only when it returns; a kept connection
    the peer had closed (request raised _Stale) is replaced by a new one, once."""
    for _ in range(2):
        sock, reused = pool.take(endpoint, timeout)
        try:
            result = request(sock)
        except _Stale as stale:
            sock.close()
            if reused:
                continue
            raise stale.__cause__ from None
        except BaseException:
            sock.close()
            raise
        pool.give(endpoint, sock)
        return result
    raise AssertionError("unreachable: a new connection is never stale")


def put(
    endpoint: Endpoint,
    secret: str,
    data: bytes | bytearray | memoryview,
    sha: str = "",
    timeout: float = TIMEOUT_S,
    pool: Pool = POOL,
) -> str:
    """Sends data, hashed by a second thread while it goes (the sha then follows in the trailer) unless
    sha is given; returns the sha256 the coordinator verified and kept. A kept connection the
    coordinator had closed (it ends without a word: no status) is retried once on a new one: what went
    out on it was dropped unread, a cut PUT keeps nothing, and a PUT of the same bytes is the same PUT."""
    view = memoryview(data).cast("B")
    hasher = hashlib.sha256()
    hashing = (
        None if sha else threading.Thread(target=hasher.update, args=(view,), name="bulk-hash", daemon=True)
    )
    if hashing is not None:
        hashing.start()

    def request(sock: socket.socket) -> str:
        expiry, mine = int(time.time()) + TICKET_TTL_S, sha
        with _stale_when_peer_closed():
            try:
                sock.sendall(encode_header(secret, PUT, sha, len(view), expiry))
                send_view(sock, view)
                if hashing is not None:
                    hashing.join()
                    mine = hasher.hexdigest()
                    sock.sendall(encode_trailer(secret, mine, len(view), expiry))
            except OSError:
                read_status(sock)  # the coordinator refused early and closed: its line, if it said one
                raise
            back, _ = read_status(sock)
        if back != mine:
            raise WireError(f"coordinator stored {back[:12]} for a blob that hashes to {mine[:12]}")
        return back

    return _exchange(endpoint, timeout, pool, request)


def get(
    endpoint: Endpoint,
    secret: str,
    sha: str,
    into: Callable[[int], bytearray | mmap.mmap] = bytearray,
    timeout: float = TIMEOUT_S,
    pool: Pool = POOL,
) -> bytearray | mmap.mmap:
    """The blob received straight into its final buffer, into(size) (a bytearray, or a map of the cache
    file it is kept in), hashed by this thread while a second one reads the socket; WireError unless it
    is whole and hashes to sha. A kept connection found closed before the status (no byte of the blob
    moved) is retried once on a new one."""

    def request(sock: socket.socket) -> bytearray | mmap.mmap:
        with _stale_when_peer_closed():
            sock.sendall(encode_header(secret, GET, sha, 0, int(time.time()) + TICKET_TTL_S))
            named, size = read_status(sock)
        if named != sha:
            raise WireError(f"asked for blob {sha[:12]}, offered {named[:12]}")
        buf = into(size)
        chunks = overlapped_if_big(landed_chunks(sock, memoryview(buf), sha), size)
        return receive_into_buffer(chunks, sha, landed=buf)

    return _exchange(endpoint, timeout, pool, request)


def secret_of(metadata: list | tuple) -> str:
    """The farm secret from call metadata (`authorization: Bearer <secret>`): the key of the tickets."""
    for key, value in metadata:
        if key == "authorization" and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    raise ValueError("no farm secret in the call metadata")
