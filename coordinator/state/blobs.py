"""Content-addressed blob files on the coordinator's disk (data_dir/blobs/ab/cdef...).

A blob is written to a temp file while its sha256 is computed, and renamed into place only when
the hash matches what the sender declared, so a path that exists always holds verified bytes.
Redis keeps a reference (sha -> path, size) through FarmStore.put_blob_ref. The fsync happens just
after, off the request path (_Flusher): a power loss in that moment can leave a recent blob short, as
it can lose Redis's last second; a tensor's header then disagrees with its length and reading fails.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mmap
import os
import queue
import re
import struct
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from protos.blobwire import Chunk, Receiver, file_chunks
from protos.tensors import CHUNK_BYTES, MAGIC, decode_tensor, tensor_header

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_MAX_BLOB_BYTES = 64 * 1024**3


class BlobError(Exception):
    """Base class for blob store refusals."""


class BlobMismatch(BlobError):
    """Received bytes do not hash to the declared sha256."""


class BlobTooLarge(BlobError):
    """A blob above the store's size limit."""


class BlobNotFound(BlobError):
    """No verified blob with that sha256."""


def check_sha(sha: str) -> str:
    """Only lowercase hex sha256 may become a path (no traversal through blob names)."""
    if not isinstance(sha, str) or not _SHA_RE.match(sha):
        raise BlobError(f"not a sha256 hex digest: {sha!r:.80}")
    return sha


class _Flusher:
    """Makes landed blobs durable off the request path: a blob is visible once renamed into place, and a
    thread fsyncs it right after, so durability matches Redis's own (AOF everysec) without 5-10 ms of
    fsync on every tile upload and reducer output on the path a render waits on."""

    def __init__(self) -> None:
        self._paths: queue.SimpleQueue[Path] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def add(self, path: Path) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="blob-fsync", daemon=True)
                self._thread.start()
        self._paths.put(path)

    def _run(self) -> None:
        while True:
            path = self._paths.get()
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue  # forgotten (retention) before its turn
            try:
                os.fsync(fd)
            except OSError:
                pass
            finally:
                os.close(fd)


FLUSHER = _Flusher()


class BlobRefs(Protocol):
    """What the blob files tell the store: a verified blob's record (put_blob_ref.lua)."""

    def put_blob_ref(self, sha: str, path: str, size: int) -> None: ...


class BlobStore:
    """Verified, content-addressed files; refs recorded in the FarmStore when one is given."""

    def __init__(self, data_dir: Path, store: BlobRefs | None = None, max_bytes: int = DEFAULT_MAX_BLOB_BYTES):
        self.root = Path(data_dir) / "blobs"
        self.root.mkdir(parents=True, exist_ok=True)
        self._tmp = self.root / "tmp"
        self._tmp.mkdir(exist_ok=True)
        self.store = store
        self.max_bytes = max_bytes

    def path(self, sha: str) -> Path:
        check_sha(sha)
        return self.root / sha[:2] / sha[2:]

    def has(self, sha: str) -> bool:
        try:
            return self.path(sha).is_file()
        except BlobError:
            return False

    def size(self, sha: str) -> int:
        p = self.path(sha)
        if not p.is_file():
            raise BlobNotFound(sha)
        return p.stat().st_size

    def put_stream(self, declared_sha: str, chunks: Iterable[bytes | memoryview]) -> tuple[str, int]:
        """Write chunks to a temp file, verify the sha256, then rename into place.

        Nothing is kept when the hash differs or the blob is too large.
        """
        check_sha(declared_sha)
        return self.put_chunks((Chunk(memoryview(c)) for c in chunks), declared_sha)

    def land(self, size: int) -> tuple[str, mmap.mmap | bytearray] | None:
        """A temp file of size bytes, reserved on disk, and a map over it, for a receiver that lands a
        blob's bytes in place (the data channel): put_chunks(chunks, landed=path) then checks and keeps
        it as it would written chunks. None where the disk cannot be reserved up front (no
        posix_fallocate: macOS), since a map over a sparse file on a full disk faults (SIGBUS)."""
        if size > self.max_bytes:
            raise BlobTooLarge(f"blob of {size} bytes exceeds {self.max_bytes}")
        if not hasattr(os, "posix_fallocate"):
            return None
        fd, tmp_name = tempfile.mkstemp(dir=self._tmp, prefix="put-")
        try:
            if size:
                os.posix_fallocate(fd, 0, size)
            return tmp_name, mmap.mmap(fd, size) if size else bytearray()
        except OSError as exc:
            Path(tmp_name).unlink(missing_ok=True)
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                return None
            raise BlobError(f"cannot reserve {size} bytes for a blob: {exc.strerror}") from None
        finally:
            os.close(fd)

    def put_chunks(self, chunks: Iterable[Chunk], expected: str = "", landed: str | None = None) -> tuple[str, int]:
        """One pass: each chunk hashed and written as it arrives, the name (given, or declared by the
        stream's first or last chunk) checked at the end, then the file renamed into place. `landed`:
        the temp file from land() whose map the chunks are views of (hashed, not written again)."""
        rx = Receiver(expected)
        fd, tmp_name = (-1, landed) if landed else tempfile.mkstemp(dir=self._tmp, prefix="put-")
        try:
            with os.fdopen(fd, "wb", buffering=0) if fd >= 0 else contextlib.nullcontext() as f:
                for chunk in chunks:
                    data = rx.take(chunk)
                    if rx.received > self.max_bytes:
                        raise BlobTooLarge(f"blob exceeds {self.max_bytes} bytes")
                    if rx.declared:
                        check_sha(rx.declared)  # a bad name ends the stream before its bytes land
                    if f is not None:
                        _write_all(f, data)
            declared, actual = check_sha(rx.declared), rx.actual()
            if actual != declared:
                raise BlobMismatch(f"sha256 mismatch: declared {declared}, received {actual}")
            target = self.path(actual)
            target.parent.mkdir(exist_ok=True)
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
        FLUSHER.add(target)
        if self.store is not None:
            self.store.put_blob_ref(actual, str(target), rx.received)
        return actual, rx.received

    def put_bytes(self, data: bytes) -> str:
        """Store in-process bytes (the coordinator's own products, tests)."""
        sha = hashlib.sha256(data).hexdigest()
        view = memoryview(data)
        self.put_stream(sha, (view[i : i + CHUNK_BYTES] for i in range(0, max(len(data), 1), CHUNK_BYTES)))
        return sha

    def wire_chunks(self, sha: str) -> Iterator[Chunk]:
        """The blob as wire chunks (views of its memory map, the first naming it and its size)."""
        p = self.path(sha)
        if not p.is_file():
            raise BlobNotFound(sha)
        return file_chunks(p, sha)

    def iter_chunks(self, sha: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        p = self.path(sha)
        try:
            f = open(p, "rb")  # noqa: SIM115 - generator owns the file
        except FileNotFoundError:
            raise BlobNotFound(sha) from None
        with f:
            while True:
                data = f.read(chunk_bytes)
                if not data:
                    return
                yield data

    def read(self, sha: str) -> bytes:
        try:
            return self.path(sha).read_bytes()
        except FileNotFoundError:
            raise BlobNotFound(sha) from None

    def read_tensor(self, sha: str) -> np.ndarray:
        return decode_tensor(self.read(sha))

    def tensor_frames(self, sha: str) -> TensorFrames:
        """A stored (..., F, h, w)-style tensor read a slice at a time, never whole (decode tiles)."""
        dtype, shape, payload = self.header(sha)
        path = self.path(sha)
        return TensorFrames(path, np.dtype(dtype), shape, path.stat().st_size - payload)

    def header(self, sha: str) -> tuple[str, tuple[int, ...], int]:
        """(dtype, shape, payload bytes the header promises) read from the file's first bytes only."""
        p = self.path(sha)
        try:
            with open(p, "rb") as f:
                head = f.read(len(MAGIC) + 4)
                if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
                    raise BlobError(f"blob {sha[:12]} is not a tensor")
                (hlen,) = struct.unpack("<I", head[len(MAGIC) :])
                if hlen > 1 << 20:
                    raise BlobError(f"blob {sha[:12]} has an oversized header")
                head += f.read(hlen)
        except FileNotFoundError:
            raise BlobNotFound(sha) from None
        try:
            dtype, shape = tensor_header(head)
            expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        except (ValueError, KeyError, TypeError) as exc:
            raise BlobError(f"blob {sha[:12]} has a bad tensor header: {exc}") from None
        if p.stat().st_size != len(head) + expected:
            raise BlobError(f"blob {sha[:12]} payload size does not match {dtype}{list(shape)}")
        return dtype, shape, expected


class TensorFrames:
    """A 5-D tensor blob (B, C, F, h, w) on disk: `t[:, :, k]` reads frame k alone (B*C reads into
    one array), so a 287 MiB decode tile costs one frame of memory, not the tile."""

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...], offset: int) -> None:
        if len(shape) != 5:
            raise BlobError(f"expected a (B, C, F, h, w) tensor, not {list(shape)}")
        self.path, self.dtype, self.shape, self.offset = path, dtype.newbyteorder("<"), tuple(shape), offset

    def __getitem__(self, key: tuple) -> np.ndarray:
        if len(key) != 3 or key[:2] != (slice(None), slice(None)) or not isinstance(key[2], int):
            raise TypeError("TensorFrames supports [:, :, k] only")
        b, c, frames, h, w = self.shape
        k = key[2]
        if not 0 <= k < frames:
            raise IndexError(f"frame {k} of {frames}")
        out = np.empty((b, c, h, w), self.dtype)
        plane = h * w * self.dtype.itemsize
        with open(self.path, "rb", buffering=0) as f:
            for i in range(b * c):
                f.seek(self.offset + (i * frames + k) * plane)
                view = memoryview(out.reshape(b * c, h * w)[i]).cast("B")
                if f.readinto(view) != plane:
                    raise BlobError(f"{self.path.name[:12]} is shorter than its header says")
        return out.astype(self.dtype.newbyteorder("="), copy=False)


def _write_all(f, data: memoryview) -> None:
    """An unbuffered write may take part of a view; write the rest."""
    while len(data):
        data = data[f.write(data) :]
