"""Blob bytes on the wire at line rate: the FarmBlobs calls with a hand-written codec for BlobChunk.

The generated protobuf classes copy every chunk twice (into the message, out of it) and want `bytes`,
so a 256 MiB blob costs 512 copies and a second hashing pass. Here a chunk is encoded straight from
a memoryview of the sender's buffer (the one copy gRPC needs to own the message) and decoded as a
memoryview into the received message (no copy). The encoding is BlobChunk's own protobuf encoding, so
generated stubs and this codec interoperate both ways; one API, one set of checks:

- the sender hashes while it streams and names the sha256 in the first chunk when it already knows
  it, else in the last (an empty chunk carrying only the name);
- the first chunk may carry the blob's size, so the receiver sizes its buffer once;
- the receiver hashes every chunk as it arrives and refuses the blob at the end unless it matches.
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

SERVICE = "ltxfarm.v1.FarmBlobs"
PUT_METHOD = f"/{SERVICE}/PutBlob"
GET_METHOD = f"/{SERVICE}/GetBlob"
# Big enough that per-message costs vanish, small enough to stay under the 4 MiB message limit of
# every channel and server (and keep the first chunk's latency low).
WIRE_CHUNK_BYTES = 2 * 1024 * 1024
_SHA, _DATA, _SIZE = 0x0A, 0x12, 0x18  # BlobChunk fields 1 (string), 2 (bytes), 3 (int64 varint)
MAX_SIZE_HINT = 64 * 1024**3  # a buffer sized from a first chunk never exceeds the store's own limit


class WireError(ValueError):
    """Bytes that are not a BlobChunk / BlobRequest this codec reads."""


@dataclass(frozen=True)
class Chunk:
    """One BlobChunk: data is a view into the received message (or the sender's buffer)."""

    data: memoryview
    sha256: str = ""
    size: int = 0


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def encode_chunk(chunk: Chunk) -> bytes:
    """BlobChunk's protobuf encoding, built with one copy of the data."""
    parts: list[bytes | memoryview] = []
    if chunk.sha256:
        name = chunk.sha256.encode()
        parts += [bytes([_SHA]), _varint(len(name)), name]
    if len(chunk.data):
        parts += [bytes([_DATA]), _varint(len(chunk.data)), chunk.data]
    if chunk.size:
        parts += [bytes([_SIZE]), _varint(chunk.size)]
    return b"".join(parts)


def decode_chunk(raw: bytes) -> Chunk:
    """Any valid BlobChunk encoding (fields in any order, unknown ones skipped); data is not copied."""
    buf = memoryview(raw)
    pos, sha, data, size = 0, "", memoryview(b""), 0
    while pos < len(buf):
        tag, pos = _read_varint(buf, pos)
        wire = tag & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
            size = value if tag == _SIZE else size
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            if pos + length > len(buf):
                raise WireError("truncated field")
            if tag == _SHA:
                sha = bytes(buf[pos : pos + length]).decode("ascii", "replace")
            elif tag == _DATA:
                data = buf[pos : pos + length]
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise WireError(f"unsupported wire type {wire}")
    if pos != len(buf):
        raise WireError("truncated field")
    return Chunk(data, sha, size)


def encode_request(sha: str) -> bytes:
    """BlobRequest {sha256}."""
    name = sha.encode()
    return bytes([_SHA]) + _varint(len(name)) + name


def decode_request(raw: bytes) -> str:
    return decode_chunk(raw).sha256


def encode_reply(sha: str, size: int) -> bytes:
    """PutReply {sha256, size} (field 2 is a varint there)."""
    name = sha.encode()
    return bytes([_SHA]) + _varint(len(name)) + name + (bytes([0x10]) + _varint(size) if size else b"")


def decode_reply(raw: bytes) -> tuple[str, int]:
    buf, pos, sha, size = memoryview(raw), 0, "", 0
    while pos < len(buf):
        tag, pos = _read_varint(buf, pos)
        if tag == _SHA:
            length, pos = _read_varint(buf, pos)
            sha, pos = bytes(buf[pos : pos + length]).decode("ascii", "replace"), pos + length
        elif tag == 0x10:
            size, pos = _read_varint(buf, pos)
        else:
            raise WireError(f"unexpected PutReply field {tag}")
    return sha, size


def send_chunks(data: bytes | bytearray | memoryview, sha: str = "", hasher=None,
                chunk_bytes: int = WIRE_CHUNK_BYTES) -> Iterator[Chunk]:
    """Views over data; the first names the sha256 when it is known, else hasher (fed as the chunks
    go) names it in a last, empty chunk."""
    view = memoryview(data).cast("B")
    hasher = hasher if hasher is not None or sha else hashlib.sha256()
    for i in range(0, max(len(view), 1), chunk_bytes):
        part = view[i : i + chunk_bytes]
        if hasher is not None:
            hasher.update(part)
        yield Chunk(part, sha if i == 0 else "", len(view) if i == 0 else 0)
    if not sha:
        yield Chunk(memoryview(b""), hasher.hexdigest())


def file_chunks(path: Path, sha: str, chunk_bytes: int = WIRE_CHUNK_BYTES) -> Iterator[Chunk]:
    """A stored blob as views of its memory map: the file is read once, by the encoder's copy."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        # Not closed here: the last chunk's view may still be on its way; the map goes with its views.
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    view = memoryview(mapped)
    if size == 0:
        yield Chunk(view, sha)
    for i in range(0, size, chunk_bytes):
        yield Chunk(view[i : i + chunk_bytes], sha if i == 0 else "", size if i == 0 else 0)


class Receiver:
    """Hashes chunks as they arrive and learns the declared sha256 (first chunk, else last)."""

    def __init__(self, expected: str = "") -> None:
        self.hasher = hashlib.sha256()
        self.declared = expected
        self.size_hint = 0
        self.received = 0

    def take(self, chunk: Chunk) -> memoryview:
        """Account for one chunk; returns its data for the caller to keep."""
        if chunk.sha256 and not self.declared:
            self.declared = chunk.sha256
        if chunk.size and not self.size_hint:
            self.size_hint = chunk.size
        self.hasher.update(chunk.data)
        self.received += len(chunk.data)
        return chunk.data

    def actual(self) -> str:
        return self.hasher.hexdigest()


def receive_into_buffer(chunks: Iterable[Chunk], expected: str,
                        sink: Callable[[memoryview], None] | None = None,
                        landed: bytearray | mmap.mmap | None = None) -> bytearray:
    """A whole blob in one buffer (sized once from the first chunk's size), each chunk also handed to
    sink as it lands; raises WireError unless it is whole and hashes to expected. `landed`: the buffer
    the chunks are already views of, in order (protos.bulkwire received them there): checked, not copied."""
    rx = Receiver(expected)
    buf, presized = (bytearray(), False) if landed is None else (landed, True)
    for i, chunk in enumerate(chunks):
        data = rx.take(chunk)
        if i == 0 and landed is None and 0 < rx.size_hint <= MAX_SIZE_HINT:
            buf, presized = bytearray(rx.size_hint), True
        if not presized:
            buf += data
        elif rx.received > len(buf):
            raise WireError(f"blob {expected[:12]} is longer than its first chunk said")
        elif landed is None:
            buf[rx.received - len(data) : rx.received] = data
        if sink is not None:
            sink(data)
    if rx.received != len(buf):
        raise WireError(f"blob {expected[:12]} truncated: {rx.received} of {len(buf)} bytes")
    if rx.actual() != expected:
        raise WireError(f"blob {expected[:12]} arrived corrupt (got {rx.actual()[:12]})")
    return buf


class BlobStub:
    """The FarmBlobs calls with this codec (same methods, same wire as the generated stub)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._put = channel.stream_unary(PUT_METHOD, request_serializer=encode_chunk,
                                         response_deserializer=decode_reply)
        self._get = channel.unary_stream(GET_METHOD, request_serializer=encode_request,
                                         response_deserializer=decode_chunk)

    def put(self, data: bytes | bytearray | memoryview, timeout: float, metadata=None, sha: str = "") -> str:
        """Streams data, hashed on the way unless sha is given; the sha256 both ends agree on."""
        hasher = None if sha else hashlib.sha256()
        back, _ = self._put(send_chunks(data, sha, hasher), timeout=timeout, metadata=metadata)
        mine = sha or hasher.hexdigest()
        if back != mine:
            raise WireError(f"coordinator stored {back[:12]} for a blob that hashes to {mine[:12]}")
        return back

    def get(self, sha: str, timeout: float, metadata=None) -> Iterator[Chunk]:
        """The raw chunk stream; pass it to receive_into_buffer (or a store) to verify."""
        return self._get(sha, timeout=timeout, metadata=metadata)


def add_blob_service(server: grpc.Server, put: Callable, get: Callable) -> None:
    """Serve PutBlob(put: (Iterator[Chunk], context) -> (sha, size)) and GetBlob(get: (sha, context)
    -> Iterator[Chunk]) with this codec."""
    handlers = {
        "PutBlob": grpc.stream_unary_rpc_method_handler(
            put, request_deserializer=decode_chunk, response_serializer=lambda r: encode_reply(*r)),
        "GetBlob": grpc.unary_stream_rpc_method_handler(
            get, request_deserializer=decode_request, response_serializer=encode_chunk),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
