"""The pieces a pack copy trusts, on real files: block checks cut a `.part` at its first bad block (on
resume and as bytes arrive, across chunk and block boundaries), and the shelf hashes a file again only
when its size or mtime moved."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from coordinator.api.packs import PackShelf, hash_file
from protos import farm_pb2
from worker.packsync import _PartFile

BLOCK = 4096


def entry_for(path: Path) -> farm_pb2.PackFile:
    sha, blocks = hash_file(path, BLOCK)
    return farm_pb2.PackFile(path=path.name, size=path.stat().st_size, sha256=sha, block_sha256=list(blocks))


def test_resume_cuts_at_the_first_bad_block_and_keeps_a_good_partial_tail(tmp_path: Path):
    data = os.urandom(5 * BLOCK + 123)
    source = tmp_path / "w.bin"
    source.write_bytes(data)
    entry = entry_for(source)
    part = tmp_path / "w.bin.part"
    part.write_bytes(data[: 3 * BLOCK + 700])  # three whole blocks and a partial one
    assert _PartFile(part, entry, BLOCK).resume() == 3 * BLOCK + 700
    bad = bytearray(data[: 3 * BLOCK + 700])
    bad[BLOCK + 5] ^= 0xFF  # block 1 corrupt on disk
    part.write_bytes(bad)
    resumed = _PartFile(part, entry, BLOCK)
    assert resumed.resume() == BLOCK and part.stat().st_size == BLOCK
    fd = os.open(part, os.O_WRONLY)
    try:
        os.lseek(fd, BLOCK, os.SEEK_SET)
        for i in range(BLOCK, len(data), 1000):  # chunks that straddle block boundaries
            assert resumed.write(fd, data[i:i + 1000])
    finally:
        os.close(fd)
    assert resumed.offset == len(data) and resumed.whole.hexdigest() == entry.sha256
    assert part.read_bytes() == data


def test_a_bad_block_arriving_is_refused_and_the_hashes_roll_back(tmp_path: Path):
    data = os.urandom(3 * BLOCK)
    source = tmp_path / "w.bin"
    source.write_bytes(data)
    entry = entry_for(source)
    part = _PartFile(tmp_path / "w.bin.part", entry, BLOCK)
    part.resume()
    fd = os.open(part.path, os.O_WRONLY)
    try:
        assert part.write(fd, data[:BLOCK + 100])
        wrong = bytearray(data[BLOCK + 100: 2 * BLOCK + 50])
        wrong[10] ^= 1
        assert not part.write(fd, bytes(wrong))  # completes block 1 with a flipped bit
        assert part.offset == BLOCK and os.fstat(fd).st_size == BLOCK
        assert part.write(fd, data[BLOCK:])  # fetched again from the block start
    finally:
        os.close(fd)
    assert part.whole.hexdigest() == hashlib.sha256(data).hexdigest() == entry.sha256
    assert part.path.read_bytes() == data


def test_shelf_hashes_once_and_again_when_a_file_changes(tmp_path: Path):
    pack = tmp_path / "p"
    (pack / "text_encoder").mkdir(parents=True)
    (pack / "config.json").write_text("{}")
    (pack / "text_encoder" / "model.safetensors").write_bytes(b"a" * 100)
    (pack / ".cache").mkdir()
    (pack / ".cache" / "x").write_text("hidden")
    (pack / "vae_decoder.safetensors.part").write_bytes(b"partial")
    shelf = PackShelf(tmp_path, block_bytes=BLOCK)
    first = {f.path: f.sha256 for f in shelf.files("p")}
    assert set(first) == {"config.json", "text_encoder/model.safetensors"}  # no hidden, no .part
    cache = tmp_path / ".farm-sha256" / "p.json"
    stamp = cache.stat().st_mtime_ns
    assert {f.path: f.sha256 for f in shelf.files("p")} == first and cache.stat().st_mtime_ns == stamp
    (pack / "config.json").write_text('{"a": 1}')
    again = {f.path: f.sha256 for f in shelf.files("p")}
    assert again["config.json"] == hashlib.sha256(b'{"a": 1}').hexdigest() != first["config.json"]
    assert again["text_encoder/model.safetensors"] == first["text_encoder/model.safetensors"]
