"""The bulk data channel: blob bytes over a TCP socket beside gRPC, at line rate.

Same blobs, same checks as the FarmBlobs calls (protos.blobwire): chunks are blobwire.Chunk views, the
receiver hashes them with blobwire.Receiver (receive_into_buffer on the worker, BlobStore.put_chunks on
the coordinator) and refuses a blob that is short, long or hashes to anything but its name. Only the
framing differs, one request per connection:

    request   MAGIC, VERSION, op (PUT/GET), sha256 hex (zeros: a PUT names it in its trailer), size
              (PUT), expiry (unix seconds), ticket = HMAC-SHA256(secret, op|sha|size|expiry)
    PUT       the size bytes, then (when the header named no sha) a trailer: sha256 + its own ticket
    status    MAGIC, code, sha256, size, a one-line message (OK, or why not)
    GET       after an OK status, the size bytes

The farm secret never crosses this channel: a ticket proves the sender holds it and moves only the blob
it names until it expires. The coordinator serves the channel over TLS with its gRPC certificate (the
client pins the CA by the join token's fingerprint, as for gRPC) unless its operator chose plain TCP.
"""

from __future__ import annotations

import hashlib
import hmac
import mmap
import queue
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache

from protos.auth import SERVER_NAME
from protos.blobwire import Chunk, WireError, receive_into_buffer

MAGIC, VERSION = b"LTXB", 1
PUT, GET = 1, 2
OK, BAD_TICKET, EXPIRED, MISMATCH, TOO_LARGE, NOT_FOUND, BAD_REQUEST, UNAVAILABLE, TRUNCATED = range(9)
CODE_NAMES = (
    "ok",
    "bad ticket",
    "expired",
    "mismatch",
    "too large",
    "not found",
    "bad request",
    "unavailable",
    "truncated",
)
# Refusals a retry can cure: a transfer corrupted or cut on the way, a standby or a busy coordinator.
AGAIN = (MISMATCH, UNAVAILABLE, TRUNCATED)
_HEADER = struct.Struct("<4sBB64sQQ32s")
_TRAILER = struct.Struct("<64s32s")
_STATUS = struct.Struct("<4sB64sQH")
_NO_SHA = b"0" * 64
TICKET_TTL_S = 600  # a ticket's life: replays end with it
MAX_AHEAD_S = 3600  # a ticket expiring later than this (a skewed or forged clock) is refused
BLOCK = 2 * 1024 * 1024  # what one recv_into / hash / write step moves
TIMEOUT_S = 60.0  # a socket silent this long is given up (per call, not per blob)


class BulkRefused(WireError):
    """The other end refused the transfer; str() is its one line, code says why (CODE_NAMES)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def again(self) -> bool:
        return self.code in AGAIN


@dataclass(frozen=True)
class Header:
    op: int
    sha: str  # "" when a PUT names it in the trailer
    size: int
    expiry: int
    ticket: bytes


def ticket(secret: str, op: int, sha: str, size: int, expiry: int) -> bytes:
    return hmac.new(
        secret.encode(), f"ltxb{VERSION}|{op}|{sha}|{size}|{expiry}".encode(), hashlib.sha256
    ).digest()


def encode_header(secret: str, op: int, sha: str, size: int, expiry: int) -> bytes:
    sha_field = sha.encode() if sha else _NO_SHA
    return _HEADER.pack(MAGIC, VERSION, op, sha_field, size, expiry, ticket(secret, op, sha, size, expiry))


def decode_header(raw: bytes) -> Header:
    magic, version, op, sha, size, expiry, mac = _HEADER.unpack(raw)
    if magic != MAGIC or version != VERSION or op not in (PUT, GET):
        raise BulkRefused(BAD_REQUEST, "not a bulk request of this version")
    name = "" if sha == _NO_SHA else sha.decode("ascii", "replace")
    return Header(op, name, size, expiry, mac)


def check_mac(header: Header, secret: str) -> None:
    """BulkRefused unless header.ticket is the secret's MAC of its (op, sha, size, expiry)."""
    if not hmac.compare_digest(
        header.ticket, ticket(secret, header.op, header.sha, header.size, header.expiry)
    ):
        raise BulkRefused(BAD_TICKET, "bad ticket: not signed with this farm's token, or for another blob")


def check_ticket(header: Header, secret: str, now: float | None = None) -> None:
    """check_mac, and the ticket has not expired (nor expires implausibly far ahead)."""
    check_mac(header, secret)
    now = time.time() if now is None else now
    if header.expiry < now:
        raise BulkRefused(EXPIRED, "expired ticket")
    if header.expiry > now + MAX_AHEAD_S:
        raise BulkRefused(EXPIRED, "ticket valid too far ahead (check this machine's clock)")


def read_header(sock: socket.socket) -> Header:
    return decode_header(recv_bytes(sock, _HEADER.size))


def read_trailer(sock: socket.socket, header: Header) -> Header:
    """A PUT's trailer as the header it completes (its sha and the ticket over it), for check_mac."""
    sha, mac = _TRAILER.unpack(recv_bytes(sock, _TRAILER.size))
    return Header(PUT, sha.decode("ascii", "replace"), header.size, header.expiry, mac)


TRAILER_BYTES = _TRAILER.size


def encode_trailer(secret: str, sha: str, size: int, expiry: int) -> bytes:
    return _TRAILER.pack(sha.encode(), ticket(secret, PUT, sha, size, expiry))


def encode_status(code: int, sha: str = "", size: int = 0, message: str = "") -> bytes:
    line = message.splitlines()[0].encode()[:1000] if message else b""
    return _STATUS.pack(MAGIC, code, sha.encode() if sha else _NO_SHA, size, len(line)) + line


def read_status(sock: socket.socket) -> tuple[str, int]:
    """(sha, size) of an OK status; BulkRefused with the other end's line otherwise."""
    magic, code, sha, size, length = _STATUS.unpack(recv_bytes(sock, _STATUS.size))
    message = recv_bytes(sock, length).decode("utf-8", "replace") if length else ""
    if magic != MAGIC:
        raise BulkRefused(BAD_REQUEST, "not a bulk status")
    if code != OK:
        raise BulkRefused(
            code, message or (CODE_NAMES[code] if code < len(CODE_NAMES) else f"refused ({code})")
        )
    return sha.decode("ascii", "replace"), size


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], len(view) - got)
        if not n:
            raise BulkRefused(TRUNCATED, f"stream ended after {got} of {len(view)} bytes")
        got += n


def recv_bytes(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_exact(sock, memoryview(buf))
    return bytes(buf)


def send_view(sock: socket.socket, view: memoryview) -> None:
    for i in range(0, len(view), BLOCK):
        sock.sendall(view[i : i + BLOCK])


def landed_chunks(sock: socket.socket, view: memoryview, sha: str) -> Iterator[Chunk]:
    """The blob received straight into its final buffer, a Chunk view per BLOCK (the first names it)."""
    if not len(view):
        yield Chunk(view, sha)
    for i in range(0, len(view), BLOCK):
        part = view[i : i + BLOCK]
        recv_exact(sock, part)
        yield Chunk(part, sha if i == 0 else "", len(view) if i == 0 else 0)


def ring_chunks(sock: socket.socket, size: int, ring: list[memoryview], sha: str) -> Iterator[Chunk]:
    """size bytes received into a ring of reusable slots. Through overlapped(depth=len(ring) - 2) a slot
    is refilled only after its consumer asked for the next chunk (so was done with it)."""
    if size == 0:
        yield Chunk(memoryview(b""), sha)
    for k, start in enumerate(range(0, size, BLOCK)):
        part = ring[k % len(ring)][: min(BLOCK, size - start)]
        recv_exact(sock, part)
        yield Chunk(part, sha if k == 0 else "", size if k == 0 else 0)


_END = object()


def overlapped(chunks: Iterator[Chunk], depth: int = 2) -> Iterator[Chunk]:
    """chunks produced by a thread of their own (the socket reads) while the caller consumes the ones
    before (hashing, writing): socket calls and hashlib release the GIL, so both run at once. The
    producer's error is raised here; a consumer that stops stops the producer at its next chunk."""
    handoff: queue.Queue = queue.Queue(maxsize=depth)
    done = threading.Event()

    def offer(item: object) -> bool:
        while not done.is_set():
            try:
                handoff.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for chunk in chunks:
                if not offer(chunk):
                    return
            offer(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            offer(exc)

    thread = threading.Thread(target=pump, name="bulk-recv", daemon=True)
    thread.start()
    try:
        while (item := handoff.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        done.set()


# --- the client side (workers, the bench) ---


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


def put(
    endpoint: Endpoint,
    secret: str,
    data: bytes | bytearray | memoryview,
    sha: str = "",
    timeout: float = TIMEOUT_S,
) -> str:
    """Sends data, hashed by a second thread while it goes (the sha then follows in the trailer) unless
    sha is given; returns the sha256 the coordinator verified and kept."""
    view = memoryview(data).cast("B")
    expiry = int(time.time()) + TICKET_TTL_S
    hasher = hashlib.sha256()
    hashing = (
        None if sha else threading.Thread(target=hasher.update, args=(view,), name="bulk-hash", daemon=True)
    )
    with connect(endpoint, timeout) as sock:
        if hashing is not None:
            hashing.start()
        try:
            sock.sendall(encode_header(secret, PUT, sha, len(view), expiry))
            send_view(sock, view)
            mine = sha
            if hashing is not None:
                hashing.join()
                mine = hasher.hexdigest()
                sock.sendall(encode_trailer(secret, mine, len(view), expiry))
        except OSError:
            back, _ = read_status(sock)  # the coordinator refused early and closed: its line, if it said one
            raise
        back, _ = read_status(sock)
    if back != mine:
        raise WireError(f"coordinator stored {back[:12]} for a blob that hashes to {mine[:12]}")
    return back


def get(
    endpoint: Endpoint,
    secret: str,
    sha: str,
    into: Callable[[int], bytearray | mmap.mmap] = bytearray,
    timeout: float = TIMEOUT_S,
) -> bytearray | mmap.mmap:
    """The blob received straight into its final buffer, into(size) (a bytearray, or a map of the cache
    file it is kept in), hashed by this thread while a second one reads the socket; WireError unless it
    is whole and hashes to sha."""
    with connect(endpoint, timeout) as sock:
        sock.sendall(encode_header(secret, GET, sha, 0, int(time.time()) + TICKET_TTL_S))
        named, size = read_status(sock)
        if named != sha:
            raise WireError(f"asked for blob {sha[:12]}, offered {named[:12]}")
        buf = into(size)
        return receive_into_buffer(overlapped(landed_chunks(sock, memoryview(buf), sha)), sha, landed=buf)


def secret_of(metadata: list | tuple) -> str:
    """The farm secret from call metadata (`authorization: Bearer <secret>`): the key of the tickets."""
    for key, value in metadata:
        if key == "authorization" and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    raise ValueError("no farm secret in the call metadata")
