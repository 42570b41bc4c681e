"""Packs reach workers over the farm (FarmPacks), verified and resumable, with real processes: a worker
killed (SIGKILL) halfway through a 256 MB file resumes from its offset, a block corrupted on its disk is
refused and fetched again, nothing shows as a pack before every hash checks; a worker that never had
the tiny pack receives it from the coordinator and renders bit-identical to the in-process reference;
`farm pack list` and the dashboard's API show who holds what and the copy's bytes / total."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from coordinator.api.packs import BLOCK_BYTES, PackShelf
from protos.packpaths import STAGING
from tests.farm.farm_harness import ROOT, assert_identical, farm_results, local_results, wait_done, wait_until

BIG = "synthetic_large.bin"
BIG_BYTES = 256 << 20
SPEC = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "frame_rate": 24.0, "seed": 5}


def start_worker(address: str, token: str, packs: Path, name: str, data: Path, *extra: str,
                 max_file_bytes: int | None = None) -> subprocess.Popen:
    from farm_cli.services import worker_command
    from tests.farm.farm_harness import token_file

    def full_disk() -> None:  # for real: a write past the limit fails with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    cmd = [*worker_command(address, token_file(data, name, token), packs, name, data / f"cache-{name}", wait_ms=500),
           *extra]
    log = open(data / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it until it exits
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            cwd=ROOT, preexec_fn=full_disk if max_file_bytes else None)


def end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(check, timeout: float, what: str, poll: float = 0.05):
    return wait_until(check, timeout, what, poll)


def worker_record(store, worker_id: str) -> dict:
    return next((w for w in store.list_workers() if w["id"] == worker_id), {})


def sha(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(1 << 24):
            digest.update(data)
    return digest.hexdigest()


@pytest.fixture
def coordinator(store, tmp_data: Path, tmp_path: Path):
    from coordinator.api.auth import load_or_create_token
    from coordinator.server import serve, stop

    shelf_dir = tmp_path / "shelf"
    shelf_dir.mkdir()
    token = load_or_create_token(tmp_data)
    server, port = serve(store, tmp_data, "127.0.0.1", 0, token, packs_dir=shelf_dir, expiry_interval_s=0.2)
    yield f"127.0.0.1:{port}", token, shelf_dir
    stop(server)


def big_pack(shelf_dir: Path, tiny: Path) -> Path:
    """The tiny pack plus 256 MB of random bytes: a pack worth resuming."""
    pack = shelf_dir / "big"
    shutil.copytree(tiny, pack, ignore=shutil.ignore_patterns(".*"))
    with open(pack / BIG, "wb") as f:
        for _ in range(BIG_BYTES >> 24):
            f.write(os.urandom(1 << 24))
    return pack


@pytest.mark.timeout(180)
def test_killed_copy_resumes_refetches_a_corrupt_block_and_loads_nothing_early(
        store, coordinator, tiny_packs: Path, tmp_data: Path, tmp_path: Path):
    from farm_cli.client import FarmClient

    address, token, shelf_dir = coordinator
    source = big_pack(shelf_dir, tiny_packs / "tiny")
    listing = PackShelf(shelf_dir).files("big")  # hashed once here; the coordinator reads the cache
    packs = tmp_path / "worker-packs"
    packs.mkdir()
    with FarmClient(address, token, timeout=30) as client:
        render_id = client.submit({**SPEC, "pack": "big"})  # only the coordinator holds "big": accepted
    part = packs / STAGING / "big" / f"{BIG}.part"
    worker = start_worker(address, token, packs, "w1", tmp_data, "--pack-max-mbps", "40")  # ~6.7 s for the file
    try:
        wait_for(lambda: part.exists() and part.stat().st_size > BIG_BYTES * 7 // 20, 90, "the copy to pass 35%")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
        kept = part.stat().st_size
        assert 4 * BLOCK_BYTES < kept < BIG_BYTES
        assert not (packs / "big").exists()  # nothing loadable yet
        assert "big" not in (worker_record(store, "w1").get("info") or {}).get("packs", [])
        sync = worker_record(store, "w1").get("pack_sync", {}).get("big", {})
        assert sync.get("state") == "copying" and 0 < sync["bytes"] < sync["total"]  # what the dashboard shows
        with open(part, "r+b") as f:  # a bit flipped on disk in block 3
            f.seek(3 * BLOCK_BYTES + 12345)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        worker = start_worker(address, token, packs, "w1", tmp_data)
        wait_for(lambda: (packs / "big").is_dir(), 120, "the pack to arrive", poll=0.2)
        done = wait_for(lambda: "big" in (worker_record(store, "w1").get("info") or {}).get("packs", []) and
                        worker_record(store, "w1"), 60, "the worker to register the pack")
    finally:
        end(worker)
    for entry in listing:
        assert sha(packs / "big" / entry.path) == entry.sha256 == sha(source / entry.path), entry.path
    manifest = json.loads((packs / "big" / ".farm-manifest.json").read_text())
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {f.path: f.sha256 for f in listing}
    assert not (packs / STAGING / "big").exists()
    # Resumed from the verified offset: blocks 0-2 kept, the corrupt block 3 and everything after it
    # fetched again, plus the files listed after the big one; never the whole pack again.
    after = sum(f.size for f in listing[[f.path for f in listing].index(BIG) + 1:])
    progress = done["pack_sync"]["big"]
    total = sum(f.size for f in listing)
    assert progress["state"] == "done" and progress["bytes"] == progress["total"] == total
    assert progress["received"] == BIG_BYTES - 3 * BLOCK_BYTES + after < total
    log = (tmp_data / "w1.log").read_text()
    assert "did not check" not in log  # the corrupt block was cut at resume, before any byte was streamed
    with FarmClient(address, token, timeout=30) as client:
        client.cancel(render_id)


@pytest.mark.timeout(120)
def test_copy_onto_a_full_disk_stops_with_one_line_and_loads_nothing(
        store, coordinator, tiny_packs: Path, tmp_data: Path, tmp_path: Path):
    from farm_cli.client import FarmClient

    address, token, shelf_dir = coordinator
    shutil.copytree(tiny_packs / "tiny", shelf_dir / "p", ignore=shutil.ignore_patterns(".*"))
    packs = tmp_path / "worker-packs"
    packs.mkdir()
    with FarmClient(address, token, timeout=30) as client:
        render_id = client.submit({**SPEC, "pack": "p"})
    worker = start_worker(address, token, packs, "w3", tmp_data, max_file_bytes=2_000_000)  # vae_encoder: 5.6 MB
    try:
        sync = wait_for(lambda: worker_record(store, "w3").get("pack_sync", {}).get("p", {}).get("state") == "failed"
                        and worker_record(store, "w3")["pack_sync"]["p"], 90, "the copy to fail", poll=0.2)
        assert worker.poll() is None  # the worker stays up for its other packs
    finally:
        end(worker)
        with FarmClient(address, token, timeout=30) as client:
            client.cancel(render_id)
    assert sync["error"].startswith("disk full writing") and "nothing partial is loaded" in sync["error"]
    assert not (packs / "p").exists()
    staged = packs / STAGING / "p"
    for path in staged.rglob("*"):  # whole files under their names; the cut one only as .part
        if path.is_file() and not path.name.startswith("."):
            assert path.name.endswith(".part") or sha(path) == sha(shelf_dir / "p" / path.relative_to(staged)), path


@pytest.mark.timeout(600)
def test_second_worker_receives_the_pack_and_renders_identical(
        store, tmp_data: Path, tiny_packs: Path, local_reference, tmp_path: Path):
    from coordinator.api.auth import load_or_create_token
    from coordinator.dashboard import start_dashboard, stop_dashboard
    from coordinator.server import serve, stop
    from farm_cli.client import FarmClient

    spec = {**SPEC, "pack": "tiny"}
    _, outputs, blobs = local_reference(spec)  # the session's: test_pack_matching renders the same spec
    token = load_or_create_token(tmp_data)
    server, port = serve(store, tmp_data, "127.0.0.1", 0, token, packs_dir=tiny_packs)
    dashboard, dash_port = start_dashboard(store, "127.0.0.1", 0, token, data_dir=tmp_data)
    address = f"127.0.0.1:{port}"
    packs = tmp_path / "w2-packs"
    packs.mkdir()
    worker = start_worker(address, token, packs, "w2", tmp_data)
    try:
        with FarmClient(address, token, timeout=30) as client:
            wait_for(lambda: worker_record(store, "w2"), 60, "w2 to register", poll=0.2)
            assert (worker_record(store, "w2").get("info") or {}).get("packs") == []
            render = wait_done(client, client.submit(spec))
            arrays = farm_results(client, render)
        wait_for(lambda: "tiny" in (worker_record(store, "w2").get("info") or {}).get("packs", []), 60, "re-register")
        listed = pack_list(address, token)
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{dash_port}/api/workers",
                                    headers={"Authorization": f"Bearer {token}"}), timeout=10) as reply:
            api = json.loads(reply.read())
    finally:
        end(worker)
        stop_dashboard(dashboard)
        stop(server)
    assert_identical(arrays, local_results(outputs, blobs))
    assert {t["worker"] for t in render["tasks"] if t.get("capability") != "coordinator"} == {"w2"}
    shelf = PackShelf(tiny_packs).files("tiny")
    assert all(sha(packs / "tiny" / f.path) == f.sha256 for f in shelf)
    assert listed["coordinator"] == [{"name": "tiny", "files": len(shelf), "bytes": sum(f.size for f in shelf)}]
    row = next(r for r in listed["workers"] if r["worker"] == "w2" and r["pack"] == "tiny")
    assert "copy" not in row  # arrived and registered
    w2 = next(w for w in api["workers"] if w["id"] == "w2")
    assert "tiny" in w2["packs"] and w2["pack_sync"]["tiny"]["state"] == "done"
    assert w2["pack_sync"]["tiny"]["bytes"] == w2["pack_sync"]["tiny"]["total"] == sum(f.size for f in shelf)


def pack_list(address: str, token: str) -> dict:
    """`farm pack list --json`, run as a user would."""
    run = subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", "pack", "list",
                          "--coordinator", address, "--json"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "FARM_TOKEN": token},
                         timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)
