"""The worker's local blob cache: content-addressed files so repeated inputs (text embeddings,
conditioning, a step's shared latent) are fetched from the coordinator once.

Every read re-verifies the sha256, so a corrupted cache file is dropped and fetched again rather
than silently fed to a model. Least-recently-used files are evicted above max_bytes.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_MAX_BYTES = 8 * 1024**3
PARTIAL_WRITE_MAX_AGE_S = 600.0  # a `.tmp-` file untouched this long was left by a killed worker


def _reserved(fd: int, size: int) -> bool:
    """The file's blocks allocated at once, so a map over it never meets a full disk (SIGBUS); False
    where that cannot be done (macOS has no posix_fallocate, some file systems refuse it)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except AttributeError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return False
        raise
    return True


def _write_fd(fd: int, data: memoryview) -> None:
    while len(data):
        data = data[os.write(fd, data) :]


class BlobCache:
    """sha256 -> bytes on local disk, verified on every read."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._drop_partial_writes()
        self._bytes = sum(size for _, size, _ in self._files())  # kept current by put/evict

    def _drop_partial_writes(self, older_than_s: float = PARTIAL_WRITE_MAX_AGE_S) -> None:
        """Half-written `.tmp-` files of a worker killed mid-fetch would sit uncounted forever; one
        untouched this long has no writer left (a live fetch touches its file with every chunk)."""
        cutoff = time.time() - older_than_s
        for p in self.root.glob("??/.tmp-*"):
            try:
                if p.stat().st_mtime < cutoff:
                    p.unlink()
            except FileNotFoundError:
                continue

    def _files(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every cached blob: one folder scan, done only to evict."""
        files = []
        for p in self.root.glob("??/*"):
            if p.name.startswith(".tmp-"):
                continue
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            files.append((st.st_mtime, st.st_size, p))
        return files

    def _path(self, sha: str) -> Path:
        if not _SHA_RE.match(sha or ""):
            raise ValueError(f"not a sha256 hex digest: {sha!r:.80}")
        return self.root / sha[:2] / sha[2:]

    def has(self, sha: str) -> bool:
        """A kept file under this name (not verified here: get() verifies when it is read)."""
        return self._path(sha).is_file()

    def get(self, sha: str) -> bytes | None:
        """Cached bytes, or None when absent or corrupt (a corrupt file is removed)."""
        path = self._path(sha)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if hashlib.sha256(data).hexdigest() != sha:
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # LRU by mtime
        return data

    def put(self, sha: str, data: bytes) -> None:
        """Keep verified bytes (refuses bytes that do not hash to sha)."""
        if hashlib.sha256(data).hexdigest() != sha:
            raise ValueError(f"refusing to cache blob {sha[:12]}: content does not match")
        if len(data) > self.max_bytes:
            return
        path = self._path(sha)
        if path.exists():  # same content already kept: just mark it recently used
            os.utime(path)
            return
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._kept(len(data))

    @contextmanager
    def writer(self, sha: str) -> Iterator[Callable[[memoryview], None]]:
        """A sink for a blob as it arrives: written to a temp file, renamed into place when the block
        ends cleanly (the caller verified the sha256 on the way), dropped when it raises."""
        path = self._path(sha)
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        size = 0
        try:
            with os.fdopen(fd, "wb", buffering=0) as f:

                def write(data: memoryview) -> None:
                    nonlocal size
                    size += len(data)
                    while len(data):
                        data = data[f.write(data) :]

                yield write
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._keep_temp(tmp, path, size)

    @contextmanager
    def landing(self, sha: str) -> Iterator[Callable[[int], mmap.mmap | bytearray]]:
        """For a receiver that lands a blob in place (protos.bulkwire): land(size) maps the cache's temp
        file, sized at once, so the bytes reach the cache as they arrive with no copy and no second
        buffer; renamed into place when the block ends cleanly (the caller verified the sha256), dropped
        when it raises. The map stays valid for its holder after the file is renamed or evicted."""
        path = self._path(sha)
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        sizes: list[int] = []
        unmapped: list[bytearray] = []  # where the disk could not be reserved: written once verified

        def land(size: int) -> mmap.mmap | bytearray:
            sizes.append(size)
            if size and _reserved(fd, size):
                return mmap.mmap(fd, size)
            unmapped.append(bytearray(size))
            return unmapped[-1]

        try:
            yield land
            for buf in unmapped:
                _write_fd(fd, memoryview(buf))
            os.close(fd)
            fd = -1
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        finally:
            if fd >= 0:
                os.close(fd)
        self._keep_temp(tmp, path, sum(sizes))

    def _keep_temp(self, tmp: str, path: Path, size: int) -> None:
        """A verified temp file renamed into place, or dropped when the blob is larger than the whole cache
        (its holder used it; keeping it would evict everything else)."""
        if size > self.max_bytes:
            Path(tmp).unlink(missing_ok=True)
            return
        try:
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._kept(size)

    def _kept(self, size: int) -> None:
        with self._lock:
            self._bytes += size
        if self._bytes > self.max_bytes:  # scan the folder only when the cache is really over
            self.evict()

    def evict(self) -> None:
        """Drop least-recently-used blobs until the cache fits max_bytes."""
        with self._lock:
            files = self._files()
            total = sum(size for _, size, _ in files)
            for _, size, p in sorted(files, key=lambda f: f[0]):
                if total <= self.max_bytes:
                    break
                p.unlink(missing_ok=True)
                total -= size
            self._bytes = total
