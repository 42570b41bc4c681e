"""A sequence-parallel group over plain TCP sockets, inside the caller's own process.

Why not `mx.distributed`: MLX caches its group per backend for the life of the process (a second
`mx.distributed.init(backend="ring")` returns the first group, whatever the new hostfile says), so a
long-lived worker cannot join a fresh ring per gang, and a ring collective stuck on a frozen peer
blocks forever (only killing the process ends it). The ring backend is plain TCP too, and an
all-gather is pure data movement, so nothing is lost: the shards arrive bit for bit as the ring's
would, while every socket here has a deadline and can be closed from this process.

The group is a full mesh of k ranks (k is small: a gang of Macs): rank r listens on its own
"host:port" and accepts the ranks above it; it connects to the ranks below it. Each connection starts
with a hello (magic, rank, degree) so a stray connection (an old gang's peer, a port scanner) is
refused. A gather sends this rank's part to every peer from small sender threads while the caller
reads the peers' parts, so no pair of ranks can wait on each other's full buffers. A deadline passed,
a reset or a closed peer closes every socket and raises `PeerLost`.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import numpy as np

MAGIC = b"LTXSP1"
HELLO = struct.Struct("!6sII")  # magic, rank, degree
LENGTH = struct.Struct("!Q")
RETRY_S = 0.05  # a lower rank not listening yet: connect again this much later


class PeerLost(ConnectionError):
    """The group did not open in time, or a peer reset, closed or missed the deadline."""


def _address(entry: str) -> tuple[str, int]:
    host, _, port = entry.rpartition(":")
    return host.strip("[]"), int(port)


def _view_bits(x: mx.array) -> np.ndarray:
    """The array's bytes in row-major order (bfloat16 has no numpy type: moved as uint16, unchanged)."""
    return np.array(x.view(mx.uint16) if x.dtype == mx.bfloat16 else x)


class SocketGroup:
    """This process's rank of a k-way group whose ranks reach each other at `hosts` (rank order).

    `all_gather(x)` is `mx.distributed.all_gather`'s contract: every rank's `x` (same shape and dtype)
    concatenated along axis 0 in rank order. `arm(s)` sets the deadline the next operations must meet
    (the caller re-arms it per step)."""

    def __init__(self, rank: int, socks: dict[int, socket.socket], degree: int, deadline_s: float):
        self._rank, self._degree, self._socks = rank, degree, socks
        self._deadline = time.monotonic() + deadline_s
        self._senders = ThreadPoolExecutor(max(1, degree - 1), thread_name_prefix=f"sp-send-{rank}")
        self._closed = threading.Event()
        self._cause = "the group was closed"  # the first loss, named by every later failure
        self._lock = threading.Lock()
        self.bytes_moved = 0

    @classmethod
    def open(cls, rank: int, hosts: list[str], timeout_s: float) -> SocketGroup:
        """Join the group as `rank` within `timeout_s`; raises `PeerLost` when it cannot form."""
        degree, deadline = len(hosts), time.monotonic() + timeout_s
        socks: dict[int, socket.socket] = {}
        try:
            listener = _listen(hosts[rank], degree)
            try:
                for peer in range(rank):
                    socks[peer] = _connect(hosts[peer], rank, degree, deadline)
                for _ in range(rank + 1, degree):
                    peer, sock = _accept(listener, degree, deadline)
                    if peer <= rank or peer in socks:
                        sock.close()
                        raise PeerLost(f"rank {peer} announced itself twice or out of order")
                    socks[peer] = sock
            finally:
                listener.close()
        except (OSError, struct.error) as exc:
            for sock in socks.values():
                sock.close()
            raise exc if isinstance(exc, PeerLost) else PeerLost(f"group of {degree} did not open: {exc}") from exc
        return cls(rank, socks, degree, max(0.0, deadline - time.monotonic()))

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._degree

    def arm(self, seconds: float) -> None:
        self._deadline = time.monotonic() + seconds

    def all_gather(self, x: mx.array) -> mx.array:
        bits = np.ascontiguousarray(_view_bits(x))
        payload = memoryview(bits).cast("B")
        n = bits.shape[0] if bits.ndim else 1
        full = np.empty((n * self._degree, *bits.shape[1:]), bits.dtype)  # each part read in place
        full[self._rank * n:(self._rank + 1) * n] = bits.reshape(n, *bits.shape[1:])
        try:
            sends = [self._senders.submit(self._send, peer, payload) for peer in self._socks]
            for peer in self._socks:
                self._receive(peer, full[peer * n:(peer + 1) * n])
            for sent in sends:
                sent.result()  # re-raises a sender's PeerLost
        except RuntimeError as exc:  # the sender pool shut down: the group was closed meanwhile
            raise PeerLost(self._cause) from exc
        self.bytes_moved += payload.nbytes * len(self._socks)
        return mx.array(full).view(mx.bfloat16) if x.dtype == mx.bfloat16 else mx.array(full)

    def close(self) -> None:
        """Close every socket (peers blocked on this rank see the end at once)."""
        self._closed.set()
        for sock in self._socks.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self._senders.shutdown(wait=False, cancel_futures=True)

    def _left(self, peer: int) -> float:
        left = self._deadline - time.monotonic()
        if self._closed.is_set():
            raise PeerLost(self._cause)
        if left <= 0:
            raise PeerLost(f"rank {peer} past the deadline")
        return left

    def _send(self, peer: int, payload: memoryview) -> None:
        """Runs on a sender thread; any failure closes the group, so the reading caller ends too."""
        try:
            sock = self._socks[peer]
            sock.settimeout(self._left(peer))
            sock.sendall(LENGTH.pack(payload.nbytes))
            sock.sendall(payload)
        except OSError as exc:
            raise self._lost(peer, exc) from exc

    def _receive(self, peer: int, into: np.ndarray) -> None:
        """The peer's part, read straight into its rows of the gathered array."""
        try:
            (size,) = LENGTH.unpack(self._read(peer, memoryview(bytearray(LENGTH.size))))
            if size != into.nbytes:
                raise PeerLost(f"rank {peer} sent {size} bytes for a part of {into.nbytes}")
            self._read(peer, memoryview(into).cast("B"))
        except OSError as exc:
            raise self._lost(peer, exc) from exc

    def _read(self, peer: int, view: memoryview) -> memoryview:
        sock, got = self._socks[peer], 0
        while got < view.nbytes:
            sock.settimeout(self._left(peer))
            chunk = sock.recv_into(view[got:], view.nbytes - got)
            if chunk == 0:
                raise PeerLost(f"rank {peer} closed the connection")
            got += chunk
        return view

    def _lost(self, peer: int, exc: OSError) -> PeerLost:
        """Close the group (every peer sees the end at once) and name the cause: the first loss, whichever
        thread (a sender, the reader) met it."""
        with self._lock:
            if not self._closed.is_set():
                self._cause = str(exc) if isinstance(exc, PeerLost) else (
                    f"rank {peer} {'past the deadline' if isinstance(exc, TimeoutError) else f'lost ({exc})'}")
                self.close()
        return PeerLost(self._cause)


def _listen(entry: str, degree: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in _address(entry)[0] else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a past gang's TIME_WAIT, not a live listener
    try:
        sock.bind(_address(entry))
        sock.listen(degree)
    except OSError:
        sock.close()
        raise
    return sock


def _tune(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _connect(entry: str, rank: int, degree: int, deadline: float) -> socket.socket:
    """Connect to a lower rank (retried while it is not listening yet) and say who this is."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PeerLost(f"{entry} did not answer before the open deadline")
        try:
            sock = socket.create_connection(_address(entry), timeout=left)
        except (ConnectionRefusedError, TimeoutError, ConnectionResetError):
            time.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
            continue
        _tune(sock).sendall(HELLO.pack(MAGIC, rank, degree))
        return sock


def _accept(listener: socket.socket, degree: int, deadline: float) -> tuple[int, socket.socket]:
    """A higher rank's connection, once its hello says it belongs to this group."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PeerLost("a peer did not join before the open deadline")
        listener.settimeout(left)
        try:
            sock, _ = listener.accept()
        except TimeoutError as exc:
            raise PeerLost("a peer did not join before the open deadline") from exc
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            magic, peer, size = HELLO.unpack(_exactly(sock, HELLO.size))
        except (OSError, struct.error):
            sock.close()
            continue
        if magic == MAGIC and size == degree and 0 <= peer < degree:
            return peer, _tune(sock)
        sock.close()


def _exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed during the hello")
        out += chunk
    return out
