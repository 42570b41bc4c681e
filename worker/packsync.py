"""A worker copies a pack it lacks from the coordinator's shelf (FarmPacks), instead of the internet.

The copy is staged in `<packs>/.farm-staging/<pack>/`, file by file: bytes land in `<file>.part`,
every 16 MiB block is checked against the coordinator's block sha256 as it completes (a bad block is
cut off and fetched again), a finished file is checked whole and renamed from `.part`. After a kill
the copy resumes: the `.part` is re-hashed block by block, cut at the first bad block, and the
stream continues from there. Only when every file checks is the manifest written and the folder
renamed into `<packs>/<pack>` in one step, so nothing is loaded before every hash checks.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from protos import farm_pb2, farm_pb2_grpc
from protos.packpaths import STAGING, check_pack_name, check_relative

log = logging.getLogger("farm.packsync")

MANIFEST = ".farm-manifest.json"
LIST_TIMEOUT_S = 3600.0   # the coordinator hashes a pack once: tens of GB can take minutes
FILE_TIMEOUT_S = 6 * 3600.0
POLL_EVERY_S = 2.0
RETRY_FAILED_S = 60.0  # a copy that failed (a full disk) is tried again this much later, not every poll
REPORT_EVERY_S = 0.5
BLOCK_RETRIES = 3
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class PackSyncError(RuntimeError):
    """A copy that cannot finish: one line that says why; what was verified stays for the next try."""


def disk_full_message(exc: OSError, what: str) -> str | None:
    """One line for a full disk (or a file size limit), else None."""
    if exc.errno not in DISK_FULL:
        return None
    return f"disk full writing {what} ({os.strerror(exc.errno)}): free space and run again; nothing partial is loaded"


class _Throttle:
    """Caps the copy rate (a worker need not take the whole LAN); None = unlimited."""

    def __init__(self, max_bytes_per_s: float | None) -> None:
        self.rate = max_bytes_per_s
        self.start = time.monotonic()
        self.sent = 0

    def wait(self, n: int) -> None:
        if not self.rate:
            return
        self.sent += n
        ahead = self.sent / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            time.sleep(ahead)


class _PartFile:
    """A `.part` file whose blocks are checked against the listed block hashes as they complete."""

    def __init__(self, path: Path, entry: farm_pb2.PackFile, block_bytes: int) -> None:
        self.path, self.size, self.block_bytes = path, int(entry.size), block_bytes
        self.blocks = list(entry.block_sha256)
        self.whole = hashlib.sha256()
        self.block = hashlib.sha256()
        self.whole_at_block = self.whole.copy()
        self.offset = 0

    def resume(self) -> int:
        """Re-hash what is on disk and cut it at the first block that does not check; the offset to go on from."""
        self.path.touch()
        with open(self.path, "rb") as f:
            while self._take(f.read(1 << 20)):
                pass
        os.truncate(self.path, self.offset)
        return self.offset

    def _take(self, data: bytes) -> bool:
        """Account bytes that are on disk in order; False at the end of data or at a block that does not
        check (then the offset and hashes roll back to that block's start)."""
        view = memoryview(data)
        while view:
            room = self.block_bytes - self.offset % self.block_bytes
            piece, view = view[:room], view[room:]
            self.whole.update(piece)
            self.block.update(piece)
            self.offset += len(piece)
            if self.offset % self.block_bytes == 0 or self.offset == self.size:
                index = (self.offset - 1) // self.block_bytes
                if index >= len(self.blocks) or self.block.hexdigest() != self.blocks[index]:
                    self.offset = index * self.block_bytes
                    self.whole = self.whole_at_block.copy()
                    self.block = hashlib.sha256()
                    return False
                self.whole_at_block = self.whole.copy()
                self.block = hashlib.sha256()
        return bool(data)

    def write(self, fd: int, data: bytes) -> bool:
        """Append data; False when it completed a block that does not check (the file is cut back)."""
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if self._take(data):
            return True
        os.ftruncate(fd, self.offset)
        os.lseek(fd, self.offset, os.SEEK_SET)
        return False


class PackSync:
    """Copies packs from the coordinator into packs_dir; one copy per pack at a time."""

    @property
    def stub(self) -> farm_pb2_grpc.FarmPacksStub:
        return farm_pb2_grpc.FarmPacksStub(self._channel())

    def __init__(self, channel: Callable[[], grpc.Channel], metadata: tuple, worker_id: str, packs_dir: Path,
                 max_bytes_per_s: float | None = None) -> None:
        self._channel = channel  # the coordinator the agent talks to now (it may move to another)
        self.metadata, self.worker_id = metadata, worker_id
        self.packs_dir = Path(packs_dir)
        self.max_bytes_per_s = max_bytes_per_s
        self.progress: dict[str, dict] = {}
        self.changed = threading.Event()   # a pack arrived: the agent registers again
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._last_poll = 0.0
        self._failed: dict[str, float] = {}  # pack -> when its last copy failed
        self._last_report = 0.0

    # ------------------------------------------------------------------ what to copy

    def have(self) -> list[str]:
        if not self.packs_dir.is_dir():
            return []
        return sorted(p.name for p in self.packs_dir.iterdir() if not p.name.startswith("."))

    def poll(self) -> None:
        """Between leases: ask which packs unfinished renders need that we lack, and copy them in the background."""
        if time.monotonic() - self._last_poll < POLL_EVERY_S:
            return
        self._last_poll = time.monotonic()
        request = farm_pb2.WantedPacksRequest(worker_id=self.worker_id, have=self.have())
        try:
            reply = self.stub.WantedPacks(request, timeout=30, metadata=self.metadata)
        except grpc.RpcError as exc:  # the lease loop notices a coordinator that is away
            log.debug("wanted packs not asked: %s", exc.code())
            return
        for pack in reply.packs:
            if time.monotonic() - self._failed.get(pack, -RETRY_FAILED_S) >= RETRY_FAILED_S:
                self.start(pack)

    def start(self, pack: str) -> threading.Thread:
        with self._lock:
            thread = self._threads.get(pack)
            if thread is None or not thread.is_alive():
                thread = threading.Thread(target=self._background, args=(pack,), name=f"packsync-{pack}", daemon=True)
                self._threads[pack] = thread
                thread.start()
            return thread

    def ensure(self, pack: str) -> bool:
        """Before a task: copy its pack now when we lack it and the coordinator holds it. True when present."""
        try:
            check_pack_name(pack)
        except ValueError:
            return False  # a path or a hub repo id: the runner resolves it itself
        if (self.packs_dir / pack).exists():
            return True
        try:
            self.stub.ListPackFiles(farm_pb2.PackRequest(pack=pack), timeout=LIST_TIMEOUT_S, metadata=self.metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return False
            raise
        self.start(pack).join()
        if not (self.packs_dir / pack).exists():
            raise PackSyncError(f"pack {pack}: copy from the coordinator failed: {self.progress.get(pack, {}).get('error')}")
        return True

    def _background(self, pack: str) -> None:
        try:
            self.sync(pack)
            self.changed.set()
        except (PackSyncError, OSError, grpc.RpcError) as exc:
            message = str(exc) if not isinstance(exc, grpc.RpcError) else f"{exc.code().name}: {exc.details()}"
            log.error("pack %s: copy stopped: %s", pack, message)
            self._failed[pack] = time.monotonic()
            self._report(pack, state="failed", error=message.splitlines()[0] if message else "", force=True)

    # ------------------------------------------------------------------ the copy

    def sync(self, pack: str) -> Path:
        """Copy one pack, verified; returns its folder. Resumes whatever an earlier run left staged."""
        final = self.packs_dir / check_pack_name(pack)
        if final.exists():
            return final
        listing = self.stub.ListPackFiles(farm_pb2.PackRequest(pack=pack), timeout=LIST_TIMEOUT_S,
                                          metadata=self.metadata)
        staging = self.packs_dir / STAGING / pack
        staging.mkdir(parents=True, exist_ok=True)
        total = sum(f.size for f in listing.files)
        with self._lock:  # two packs may copy at once; progress is one JSON for both
            self.progress[pack] = {"state": "copying", "bytes": 0, "total": total, "received": 0,
                                   "files": len(listing.files)}
        throttle = _Throttle(self.max_bytes_per_s)
        for entry in listing.files:
            self._fetch_file(pack, staging, entry, int(listing.block_bytes), throttle)
        manifest = {"pack": pack, "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in listing.files],
                    "verified_ms": int(time.time() * 1000)}
        self._write(staging / MANIFEST, json.dumps(manifest, indent=1).encode(), "the manifest")
        os.rename(staging, final)
        _fsync_dir(self.packs_dir)
        log.info("pack %s: %d files, %d bytes verified and in place (%d bytes received this run)",
                 pack, len(listing.files), total, self.progress[pack]["received"])
        self._report(pack, state="done", force=True)
        return final

    def _fetch_file(self, pack: str, staging: Path, entry: farm_pb2.PackFile, block_bytes: int,
                    throttle: _Throttle) -> None:
        rel = check_relative(entry.path)
        dest = staging / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() and dest.stat().st_size == entry.size and _sha256(dest) == entry.sha256:
            self._advance(pack, entry.size, 0)
            return
        dest.unlink(missing_ok=True)
        part = _PartFile(dest.with_name(dest.name + ".part"), entry, block_bytes)
        offset = part.resume()
        self._advance(pack, offset, 0)
        for _ in range(BLOCK_RETRIES + 1):
            if self._stream(pack, entry, part, throttle):
                break
            log.warning("pack %s: a block of %s did not check; fetching it again", pack, rel)
        else:
            raise PackSyncError(f"{pack}/{rel}: blocks keep arriving corrupt from the coordinator")
        if part.offset != entry.size or part.whole.hexdigest() != entry.sha256:
            part.path.unlink(missing_ok=True)
            raise PackSyncError(f"{pack}/{rel}: copy does not match the coordinator's sha256; fetching it again next time")
        os.replace(part.path, dest)

    def _stream(self, pack: str, entry: farm_pb2.PackFile, part: _PartFile, throttle: _Throttle) -> bool:
        """Stream the file from part.offset to its end; False when a block failed its check."""
        start = part.offset
        if start == entry.size:
            return True
        request = farm_pb2.PackFileRequest(pack=pack, path=entry.path, offset=start)
        stream = self.stub.GetPackFile(request, timeout=FILE_TIMEOUT_S, metadata=self.metadata)
        fd = os.open(part.path, os.O_WRONLY)
        try:
            os.lseek(fd, start, os.SEEK_SET)
            for chunk in stream:
                before = part.offset
                try:
                    ok = part.write(fd, chunk.data)
                except OSError as exc:
                    raise PackSyncError(disk_full_message(exc, str(part.path)) or f"{part.path}: {exc}") from exc
                self._advance(pack, part.offset - before, len(chunk.data))
                throttle.wait(len(chunk.data))
                if not ok:
                    stream.cancel()
                    return False
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def _write(self, path: Path, data: bytes, what: str) -> None:
        try:
            path.write_bytes(data)
        except OSError as exc:
            raise PackSyncError(disk_full_message(exc, what) or f"{path}: {exc}") from exc

    # ------------------------------------------------------------------ progress

    def _advance(self, pack: str, verified_or_kept: int, received: int) -> None:
        state = self.progress[pack]
        state["bytes"] = max(0, state["bytes"] + verified_or_kept)
        state["received"] += received
        self._report(pack)

    def _report(self, pack: str, force: bool = False, **fields: object) -> None:
        """Tell the coordinator (at most every REPORT_EVERY_S): the dashboard shows bytes / total."""
        with self._lock:
            self.progress.setdefault(pack, {"bytes": 0, "total": 0, "received": 0}).update(fields)
            if not force and time.monotonic() - self._last_report < REPORT_EVERY_S:
                return
            self._last_report = time.monotonic()
            progress_json = json.dumps(self.progress)
        request = farm_pb2.PackSyncReport(worker_id=self.worker_id, progress_json=progress_json)
        try:
            self.stub.ReportPackSync(request, timeout=10, metadata=self.metadata)
        except grpc.RpcError as exc:  # progress is best effort; the copy goes on
            log.debug("pack progress not reported: %s", exc.code())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(1 << 20):
            digest.update(data)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

