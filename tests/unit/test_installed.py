"""The installed set a worker reports: the lock's hash and the installed versions of what the lock names."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

import pytest

from protos import installed

pytestmark = pytest.mark.timeout(60)


def test_a_checkout_without_a_lock_says_so(tmp_path: Path) -> None:
    found = installed.installed_set(tmp_path / "requirements.lock")
    assert found["lock"] == installed.NO_LOCK and len(found["installed"]) == installed.HASH_CHARS
    assert installed.off_lock(tmp_path / "requirements.lock") == []


def test_the_lock_hash_and_the_installed_versions_it_names(tmp_path: Path) -> None:
    numpy, grpc = metadata.version("numpy"), metadata.version("grpcio")
    lock = tmp_path / "requirements.lock"
    lock.write_text(f"# uv pip compile --universal\nnumpy=={numpy}\n    # via ltx-farm\n"
                    f"grpcio==0.0.1 ; sys_platform == 'darwin'\ngrpcio=={grpc} ; sys_platform == 'linux'\n")
    found = installed.installed_set(lock)
    assert found["lock"] == hashlib.sha256(lock.read_bytes()).hexdigest()[:installed.HASH_CHARS]
    expect = hashlib.sha256(f"grpcio=={grpc}\nnumpy=={numpy}".encode()).hexdigest()[:installed.HASH_CHARS]
    assert found["installed"] == expect  # only the names the lock pins, as installed here
    assert installed.off_lock(lock) == []  # one of grpcio's platform pins is the installed one

    lock.write_text(f"Numpy=={numpy}\ngrpcio==0.0.1\n")  # another set: grpcio installed off the lock
    moved = installed.installed_set(lock)
    assert moved["lock"] != found["lock"] and moved["installed"] == found["installed"]
    assert installed.off_lock(lock) == [f"grpcio {grpc} (lock: 0.0.1)"]
    lock.write_text(f"grpcio=={grpc}+other\n")  # a pinned local build is not the plain release
    assert installed.off_lock(lock) == [f"grpcio {grpc} (lock: {grpc}+other)"]


def test_doctor_says_whether_this_mac_matches_its_lock_and_which_workers_differ(tmp_path: Path) -> None:
    from farm_cli.doctor import check_installed, fleet_sets

    lock = tmp_path / "requirements.lock"
    assert check_installed(lock)[0] == "warn" and "no requirements.lock" in check_installed(lock)[1]
    lock.write_text(f"numpy=={metadata.version('numpy')}\n")
    status, line = check_installed(lock)
    assert status == "ok" and f"every pin of this checkout's lock {installed.installed_set(lock)['lock']} is installed" in line
    lock.write_text("numpy==0.0.1\n")
    status, line = check_installed(lock)
    assert status == "warn" and "does not match" in line and f"numpy {metadata.version('numpy')} (lock: 0.0.1)" in line
    mine = installed.installed_set()["installed"]
    rows = [{"id": "w1", "installed": {"installed": mine}, "project_version": installed.project_version()},
            {"id": "w2", "installed": {"installed": "0ther"}, "project_version": "0.0.1"}, {"id": "raw"}]
    assert fleet_sets(rows) == (f"; 1 with another installed set than this machine's {mine} (w2)"
                                "; 1 on another ltx-farm version (w2)")
