"""The bulk data channel: blob bytes over a TCP socket beside gRPC, at line rate.

Same blobs, same checks as the FarmBlobs calls (protos.blobwire): chunks are blobwire.Chunk views, the
receiver hashes them with blobwire.Receiver (receive_into_buffer on the worker, BlobStore.put_chunks on
the coordinator) and refuses a blob that is short, long or hashes to anything but its name. Only the
framing differs; a connection carries one request after another (keep-alive):

    request   MAGIC, VERSION, op (PUT/GET), sha256 hex (zeros: a PUT names it in its trailer), size
              (PUT), expiry (unix seconds), ticket = HMAC-SHA256(secret, op|sha|size|expiry)
    PUT       the size bytes, then (when the header named no sha) a trailer: sha256 + its own ticket
    status    MAGIC, code, sha256, size, a one-line message (OK, or why not)
    GET       after an OK status, the size bytes

A request that ends cleanly (OK, its bytes all moved) leaves the connection for the next one: the
server waits IDLE_S for the next header, the client keeps it in a Pool (per endpoint, POOL_SIZE idle at
most, none older than POOL_IDLE_S). Any refusal or error closes it at both ends: a stream whose state
is in doubt is never reused. Version 2 is version 1 plus reuse: either end of another version refuses
with one line (BAD_REQUEST) and closes, and the worker moves that blob over gRPC.

The farm secret never crosses this channel: a ticket proves the sender holds it and moves only the blob
it names until it expires. The coordinator serves the channel over TLS with its gRPC certificate (the
client pins the CA by the join token's fingerprint, as for gRPC) unless its operator chose plain TCP.
"""

from __future__ import annotations

import hashlib
import hmac
import queue
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from protos.blobwire import Chunk, WireError

MAGIC, VERSION = b"LTXB", 2  # 2: connections are kept for the next request
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
IDLE_S = 60.0  # the server closes a kept connection with no request for this long


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


def overlapped_if_big(chunks: Iterator[Chunk], size: int, depth: int = 2) -> Iterator[Chunk]:
    """overlapped() for a body of more than one BLOCK; one block has nothing to overlap (no thread)."""
    return overlapped(chunks, depth) if size > BLOCK else chunks


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
