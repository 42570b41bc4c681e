"""The coordinator's bulk data channel (protos/bulkwire.py): blob put/get beside gRPC, at line rate.

A listener on the gRPC host, a thread per connection (at most MAX_CONNECTIONS; more are told to try
again), one request after another on it: after a request that ended cleanly (OK, its bytes all moved)
the thread waits up to idle_s for the next header, then closes; any refusal or error closes at once.
At most MAX_ACTIVE requests move bytes at a time (kept connections mostly wait), more are told to try
again. PUT: one thread receives the bytes straight into a map of the store's temp
file (BlobStore.land: the disk reserved up front; where it cannot be, into a small ring of reusable
buffers the store writes from) while BlobStore.put_chunks hashes the chunks before (renamed into place
only when verified; nothing is kept otherwise). GET: the stored file, verified when it landed, goes out with
socket.sendfile on a plain channel (zero copy) or as views of its memory map over TLS. Tickets are
checked with the coordinator's current secret (a `farm token rotate` is followed as the gRPC
interceptor follows it); a standby answers every request with the leader's address, as LeaderGate does.
"""

from __future__ import annotations

import logging
import mmap
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from coordinator.api.tls import TLS_DIR, load_or_create_tls
from coordinator.state.blobs import BlobError, BlobMismatch, BlobNotFound, BlobStore, BlobTooLarge
from coordinator.state.store import is_transient
from protos import bulkwire as bw
from protos.blobwire import Chunk, WireError
from protos.endpoints import standby_details

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256  # open connections, a thread each: a worker keeps a few idle ones between requests
MAX_ACTIVE = 32  # requests moving bytes at once
RING_SLOTS = 4  # per PUT: one being received, one being hashed and written, two queued between them
DRAIN_LIMIT = 64 * 1024 * 1024  # bytes read and dropped after an early refusal, so the sender hears why


def server_context(data_dir: Path) -> ssl.SSLContext:
    """TLS with the gRPC server's certificate (DATA/tls): workers pin the same CA for both."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    load_or_create_tls(data_dir)
    folder = Path(data_dir) / TLS_DIR
    context.load_cert_chain(folder / "server.pem", folder / "server.key")
    return context


class BulkServer:
    """Serves bulkwire requests for `blobs` while `serving()`; `secret()` is the farm secret now."""

    def __init__(
        self,
        blobs: BlobStore,
        secret: Callable[[], str],
        serving: Callable[[], bool],
        leader: Callable[[], str],
        host: str = "127.0.0.1",
        port: int = 0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.blobs, self.secret, self.serving, self.leader, self.tls = blobs, secret, serving, leader, tls
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=64)
        self.port = self._listener.getsockname()[1]
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._active = threading.BoundedSemaphore(MAX_ACTIVE)
        self.idle_s = bw.IDLE_S  # a kept connection with no next request for this long is closed
        self.connections = 0  # accepted and served (tests, the bench): with requests, what reuse saves
        self.requests = 0  # ended cleanly
        # Accepted and not yet ended. Counted from accept (before a header is read) and released only
        # once the connection's request has ended, so its temp file is gone before the count drops:
        # `connections` reached and `open` at 0 means nothing of those connections is on disk.
        self.open = 0
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="bulk-accept", daemon=True)

    def start(self) -> BulkServer:
        self._thread.start()
        log.info("data channel on port %d (%s)", self.port, "TLS" if self.tls else "plain TCP, not encrypted")
        return self

    def stop(self) -> None:
        """No new connections; open ones are cut (a PUT cut short keeps nothing)."""
        self._stopped.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            for conn in self._open:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._thread.join(5)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed by stop()
            if not self._slots.acquire(blocking=False):
                threading.Thread(target=self._busy, args=(conn,), daemon=True).start()
                continue
            with self._lock:
                self._open.add(conn)
                self.connections += 1
                self.open += 1
            threading.Thread(target=self._serve, args=(conn,), name="bulk-conn", daemon=True).start()

    def _busy(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                conn.sendall(bw.encode_status(bw.UNAVAILABLE, message="data channel busy; try again"))
            except OSError:
                pass

    def _serve(self, raw: socket.socket) -> None:
        try:
            raw.settimeout(bw.TIMEOUT_S)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = self.tls.wrap_socket(raw, server_side=True) if self.tls else raw
            with conn:
                while not self._stopped.is_set() and self._request(conn):
                    with self._lock:
                        self.requests += 1
                    conn.settimeout(self.idle_s)  # for the next header; the request itself has TIMEOUT_S
        except (OSError, ssl.SSLError) as exc:
            log.debug("data channel connection ended: %s", exc)
        finally:
            raw.close()
            self._slots.release()
            self._release(raw)

    def _release(self, raw: socket.socket) -> None:
        """The connection's last step: its request (and a cut PUT's temp file) is already gone."""
        with self._lock:
            self._open.discard(raw)
            self.open -= 1

    def _request(self, conn: socket.socket) -> bool:
        """One request; True when it ended cleanly, so the connection can carry the next. A client that
        closes a kept connection ends here (the header cut at its first byte: nothing to answer)."""
        header: bw.Header | None = None
        try:
            header = bw.read_header(conn)
            conn.settimeout(bw.TIMEOUT_S)
            if not self.serving():
                leader = self.leader()
                raise bw.BulkRefused(bw.UNAVAILABLE, standby_details(leader))
            bw.check_ticket(header, self.secret())
            if not self._active.acquire(blocking=False):
                raise bw.BulkRefused(bw.UNAVAILABLE, "data channel busy; try again")
            try:
                if header.op == bw.GET:
                    self._get(conn, header.sha)
                else:
                    sha, size = self._put(conn, header)
                    conn.sendall(bw.encode_status(bw.OK, sha, size))
            finally:
                self._active.release()
            return True
        except (bw.BulkRefused, BlobError, WireError) as exc:
            code = _code(exc)
            if code != bw.TRUNCATED:  # a sender that went away hears nothing
                self._refuse(conn, code, str(exc), header)
            return False
        except (OSError, ssl.SSLError):
            raise  # the connection itself failed: _serve ends it
        except Exception as exc:  # noqa: BLE001 - e.g. Redis away as the blob's record is written: never a dead thread
            if not is_transient(exc):
                log.exception("data channel request failed")
            self._refuse(conn, bw.UNAVAILABLE, f"coordinator cannot take blobs now ({type(exc).__name__}); "
                         "try again", header)
            return False

    def _refuse(self, conn: socket.socket, code: int, message: str, header: bw.Header | None) -> None:
        """The one-line refusal; then, for a PUT refused before its bytes, read and drop what is still on
        its way (bounded), so closing does not reset the connection before the sender reads the line."""
        try:
            conn.sendall(bw.encode_status(code, message=message))
            if (
                header is not None
                and header.op == bw.PUT
                and code in (bw.BAD_TICKET, bw.EXPIRED, bw.TOO_LARGE, bw.UNAVAILABLE, bw.BAD_REQUEST)
            ):
                _drain(conn, min(header.size + bw.TRAILER_BYTES, DRAIN_LIMIT))
        except OSError:
            pass

    def _put(self, conn: socket.socket, header: bw.Header) -> tuple[str, int]:
        """The bytes land in place in a map of the store's temp file (no write copy), else (no way to
        reserve the disk) in a small ring of reusable buffers the store writes from; one thread reads
        the socket while put_chunks hashes the chunks before."""
        landing = self.blobs.land(header.size)
        if landing is None:
            ring = [memoryview(bytearray(bw.BLOCK)) for _ in range(RING_SLOTS)]
            body = bw.ring_chunks(conn, header.size, ring, header.sha)
            named = self._named(conn, header, body)
            return self.blobs.put_chunks(bw.overlapped_if_big(named, header.size, depth=len(ring) - 2))
        path, mapped = landing
        body = bw.landed_chunks(conn, memoryview(mapped), header.sha)
        named = self._named(conn, header, body)
        return self.blobs.put_chunks(bw.overlapped_if_big(named, header.size), landed=path)

    def _named(self, conn: socket.socket, header: bw.Header, body: Iterator[Chunk]) -> Iterator[Chunk]:
        """The body's chunks; then, when the header named no sha, the trailer's name, once its own
        ticket proves the sender signed that name (put_chunks checks the bytes hash to it)."""
        yield from body
        if not header.sha:
            named = bw.read_trailer(conn, header)
            bw.check_mac(named, self.secret())
            yield Chunk(memoryview(b""), named.sha)

    def _get(self, conn: socket.socket, sha: str) -> None:
        path = self.blobs.path(sha)
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            raise BlobNotFound(f"not found: no blob {sha}") from None
        with f:
            size = f.seek(0, 2)
            f.seek(0)
            conn.sendall(bw.encode_status(bw.OK, sha, size))
            if size and self.tls is None:
                conn.sendfile(f)
            elif size:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
                    bw.send_view(conn, view)


def _code(exc: Exception) -> int:
    if isinstance(exc, bw.BulkRefused):
        return exc.code
    if isinstance(exc, BlobMismatch):
        return bw.MISMATCH
    if isinstance(exc, BlobTooLarge):
        return bw.TOO_LARGE
    if isinstance(exc, BlobNotFound):
        return bw.NOT_FOUND
    return bw.BAD_REQUEST


def _drain(conn: socket.socket, limit: int) -> None:
    conn.settimeout(5)
    buf = bytearray(1 << 20)
    while limit > 0:
        n = conn.recv_into(buf, min(len(buf), limit))
        if not n:
            return
        limit -= n
