"""The coordinator's pack shelf: weights pulled once onto the coordinator, copied to workers file by file.

A pack is a folder in the coordinator's packs folder (`farm coordinator --packs-dir`). Workers list
its files (size, sha256 and one sha256 per block) and stream each file from an offset over FarmPacks,
so a copy resumes after a kill and a corrupt block is refetched alone. Hashes are computed once per
file and cached by (size, mtime). A path from a request is only ever served when it is one of the
pack's own listed files: no absolute paths, no `..`, no hidden names, never a file outside the folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from coordinator.plan.graph import SpecError
from coordinator.schema import check_small_object
from ltx_engine.rules import text_encoders
from protos import farm_pb2, farm_pb2_grpc
from protos.packpaths import PackRefused, check_pack_name, check_relative
from protos.states import TERMINAL
from protos.tensors import CHUNK_BYTES

log = logging.getLogger(__name__)

BLOCK_BYTES = 16 << 20  # one sha256 per 16 MiB: a corrupt block costs at most this much to refetch
HASH_CACHE = ".farm-sha256"
PACK_MARKERS = ("embedded_config.json", "config.json")
ACTIVE_RENDERS_SCANNED = 200


@dataclass(frozen=True)
class PackFileInfo:
    """One file of a pack as workers verify it."""

    path: str
    size: int
    sha256: str
    blocks: tuple[str, ...]


def hash_file(path: Path, block_bytes: int = BLOCK_BYTES) -> tuple[str, tuple[str, ...]]:
    """The file's sha256 and the sha256 of each block_bytes block, in one read."""
    whole = hashlib.sha256()
    blocks: list[str] = []
    with open(path, "rb") as f:
        while block := f.read(block_bytes):
            whole.update(block)
            blocks.append(hashlib.sha256(block).hexdigest())
    return whole.hexdigest(), tuple(blocks)


def pack_files(folder: Path) -> list[tuple[str, Path]]:
    """(relative path, path) of every servable file: hidden names, `.part` and `.incomplete` left out."""
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or name.endswith((".part", ".incomplete", ".lock")):
                continue
            path = Path(dirpath) / name
            if path.is_file():
                found.append((path.relative_to(folder).as_posix(), path))
    return found


class PackShelf:
    """The packs folder of the coordinator, with a per-file hash cache kept beside it."""

    def __init__(self, root: Path, block_bytes: int = BLOCK_BYTES) -> None:
        self.root = Path(root)
        self.block_bytes = block_bytes
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def names(self) -> list[str]:
        """Folders that look like packs (a config file at the top); staging and hidden folders never."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and any((p / m).is_file() for m in PACK_MARKERS))

    def folder(self, pack: str) -> Path:
        if check_pack_name(pack) not in self.names():
            raise FileNotFoundError(f"the coordinator holds no pack {pack!r}")
        return self.root / pack

    def files(self, pack: str) -> list[PackFileInfo]:
        """Every file of the pack with its hashes; a file is hashed again only when its size or mtime moved."""
        folder = self.folder(pack)
        with self._guard:
            lock = self._locks.setdefault(pack, threading.Lock())
        with lock:
            cache = self._read_cache(pack)
            out, fresh = [], {}
            for rel, path in pack_files(folder):
                st = path.stat()
                known = cache.get(rel) or {}
                if (known.get("size"), known.get("mtime_ns"), known.get("block_bytes")) != (
                        st.st_size, st.st_mtime_ns, self.block_bytes):
                    log.info("hashing %s/%s (%d bytes), once", pack, rel, st.st_size)
                    sha, blocks = hash_file(path, self.block_bytes)
                    known = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "block_bytes": self.block_bytes,
                             "sha256": sha, "blocks": list(blocks)}
                fresh[rel] = known
                out.append(PackFileInfo(rel, int(known["size"]), known["sha256"], tuple(known["blocks"])))
            if fresh != cache:
                self._write_cache(pack, fresh)
        return out

    def components(self, pack: str) -> list[str]:
        """The components a copy of the pack would hold, by the one table of pack files."""
        from ltx_engine.rules.components import TEXT_ENCODER, resolve_files

        folder = self.folder(pack)
        found = set(resolve_files(p.name for p in folder.iterdir() if p.is_file()).found)
        if (folder / TEXT_ENCODER).is_dir():
            found.add(TEXT_ENCODER)
            if text_encoders.lm_head_problem(folder / TEXT_ENCODER) is None:
                found.add(text_encoders.LM_HEAD)
        return sorted(found)

    def summary(self, pack: str) -> tuple[int, int]:
        """(files, bytes) without hashing."""
        entries = pack_files(self.folder(pack))
        return len(entries), sum(p.stat().st_size for _, p in entries)

    def open_file(self, pack: str, path: str) -> Path:
        """The file at `path` inside the pack, only when it is one of the pack's listed files."""
        rel = check_relative(path)
        folder = self.folder(pack)
        listed = dict(pack_files(folder))
        if rel not in listed:
            raise FileNotFoundError(f"pack {pack!r} has no file {rel!r}")
        return listed[rel]

    def warm(self) -> None:
        """Hash every pack now (a coordinator start), so the first worker does not wait for it."""
        for pack in self.names():
            try:
                self.files(pack)
            except OSError as exc:
                log.warning("cannot hash pack %s: %s", pack, exc)

    def _cache_path(self, pack: str) -> Path:
        return self.root / HASH_CACHE / f"{pack}.json"

    def _read_cache(self, pack: str) -> dict[str, Any]:
        try:
            data = json.loads(self._cache_path(pack).read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _write_cache(self, pack: str, entries: dict[str, Any]) -> None:
        path = self._cache_path(pack)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "w") as f:
                json.dump(entries, f)
            os.replace(tmp, path)
        except OSError as exc:  # a read-only shelf still serves; it hashes again next time
            log.warning("cannot write the hash cache of %s: %s", pack, exc)


def iter_file(path: Path, offset: int) -> Iterator[bytes]:
    """The file's bytes from offset, in CHUNK_BYTES pieces."""
    with open(path, "rb") as f:
        f.seek(offset)
        while data := f.read(CHUNK_BYTES):
            yield data


class PackStore(Protocol):
    """The store calls pack serving makes: which renders are live, and a worker's copy progress."""

    def list_renders(self, limit: int = 50) -> list[dict]: ...

    def worker_pack_sync(self, worker_id: str, progress: dict) -> bool: ...


def active_packs(store: PackStore) -> set[str]:
    """Packs named by renders that have not ended."""
    packs = set()
    for render in store.list_renders(ACTIVE_RENDERS_SCANNED):
        if render.get("state") not in TERMINAL:
            spec = render.get("spec") or {}
            if isinstance(spec, dict) and spec.get("pack"):
                packs.add(str(spec["pack"]))
            if isinstance(spec, dict) and spec.get("text_encoder"):  # a separate encoder travels like a pack
                packs.update(n for n in text_encoders.names(str(spec["text_encoder"])) if "/" not in n)
    return packs


def fleet_with_shelf(fleet: list[dict], shelf: PackShelf | None) -> list[dict]:
    """The fleet as it will be once workers copied the coordinator's packs: a pack (or a text encoder
    folder) only the coordinator holds is not refused at submit, since workers that need it fetch it."""
    held = shelf.names() if shelf is not None else []
    if not held:
        return fleet
    components = {name: shelf.components(name) for name in held}
    encoders = {name: text_encoders.weight_bytes(shelf.root / name) for name in held
                if text_encoders.is_encoder(shelf.root / name)}
    return [{**w, "packs": sorted(set(w.get("packs") or []) | set(held)),
             "pack_components": {**components, **(w.get("pack_components") or {})},
             **({"text_encoders": {**encoders, **w["text_encoders"]}} if isinstance(w.get("text_encoders"), dict) else {})}
            for w in fleet]


class FarmPacksServicer(farm_pb2_grpc.FarmPacksServicer):
    """FarmPacks: list and stream the shelf's packs; record workers' copy progress."""

    def __init__(self, shelf: PackShelf, store: PackStore) -> None:
        self.shelf = shelf
        self.store = store

    def _refuse(self, context, exc: Exception) -> None:
        code = grpc.StatusCode.NOT_FOUND if isinstance(exc, FileNotFoundError) else grpc.StatusCode.INVALID_ARGUMENT
        context.abort(code, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    def ListPacks(self, request, context):
        packs = []
        for name in self.shelf.names():
            files, size = self.shelf.summary(name)
            packs.append(farm_pb2.PackSummary(name=name, files=files, bytes=size))
        return farm_pb2.PackList(packs=packs)

    def ListPackFiles(self, request, context):
        try:
            files = self.shelf.files(request.pack)
        except (PackRefused, FileNotFoundError) as exc:
            self._refuse(context, exc)
        return farm_pb2.PackFiles(pack=request.pack, block_bytes=self.shelf.block_bytes, files=[
            farm_pb2.PackFile(path=f.path, size=f.size, sha256=f.sha256, block_sha256=list(f.blocks))
            for f in files])

    def GetPackFile(self, request, context) -> Iterator[farm_pb2.Chunk]:
        try:
            path = self.shelf.open_file(request.pack, request.path)
            if request.offset < 0 or request.offset > path.stat().st_size:
                raise PackRefused(f"offset {request.offset} is outside {request.path}")
        except (PackRefused, FileNotFoundError) as exc:
            self._refuse(context, exc)
        for data in iter_file(path, request.offset):
            yield farm_pb2.Chunk(data=data)

    def WantedPacks(self, request, context):
        wanted = (active_packs(self.store) & set(self.shelf.names())) - set(request.have)
        return farm_pb2.WantedPacksReply(packs=sorted(wanted))

    def ReportPackSync(self, request, context):
        if not request.worker_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "worker_id is required")
        try:  # bounded size and depth: a deeply nested report is INVALID_ARGUMENT, not a RecursionError
            progress = check_small_object(request.progress_json or "{}", "progress_json")
        except SpecError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self.store.worker_pack_sync(request.worker_id, progress)
        return farm_pb2.PackSyncAck()

