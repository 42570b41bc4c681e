"""What `farm` prints against a real coordinator (no workers): stage column, cancel twice, fetch of a
cancelled render, no stage running once cancelled, `farm status` and `farm ls` as one list, no gRPC code
names, where the token lives, `farm workers` chip and lost, doctor's clock."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.server import serve, stop
from tests.farm.farm_harness import ROOT, join_token

CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]
TOKEN = "t" * 24
JOIN: dict[str, str] = {}
SPEC = ["-p", "a heron at dusk", "-H", "256", "-W", "384", "-f", "25"]


@pytest.fixture
def coordinator(store, tmp_data, tiny_packs):
    (tmp_data / "packs").symlink_to(tiny_packs)
    server, port = serve(store, tmp_data, token=TOKEN)
    JOIN[f"127.0.0.1:{port}"] = join_token(tmp_data, TOKEN)  # TLS: clients pin this farm's CA
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop(server)


def farm(address: str, *args: str, token: str = "", data: Path | None = None) -> subprocess.CompletedProcess:
    token = token or JOIN[address]
    env = {"PATH": "/usr/bin:/bin", "FARM_DATA": str(data or ROOT / "nonexistent-farm-data"), "HOME": "/nonexistent",
           **({"FARM_TOKEN": token} if token else {})}
    extra = ["--coordinator", address]
    return subprocess.run([*CLI, *args, *extra], capture_output=True, text=True, cwd=ROOT, timeout=60, env=env)


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


@pytest.mark.timeout(120)
def test_status_cancel_and_fetch_say_what_happened(coordinator, tmp_path):
    rid = farm(coordinator, "submit", *SPEC).stdout.strip()
    listing = farm(coordinator, "status")
    row = next(line for line in listing.stdout.splitlines() if line.startswith(rid))
    assert "queued" in row and "Text" in row, listing.stdout  # the stage a queued render waits for
    detail = farm(coordinator, "status", rid).stdout
    assert "a heron at dusk" in detail and "256x384" in detail and "25 frames" in detail, detail
    assert f" by {pwd.getpwuid(os.getuid()).pw_name}@{socket.gethostname().split('.')[0]}" in detail, detail
    first = farm(coordinator, "cancel", rid)
    assert first.returncode == 0 and f"{rid} cancelled" in first.stdout
    again = farm(coordinator, "cancel", rid)
    assert again.returncode == 0 and "already cancelled" in again.stdout, again.stdout + again.stderr
    fetched = farm(coordinator, "fetch", rid, "-o", str(tmp_path / "x.mp4"))
    line = one_line(fetched)
    assert fetched.returncode == 1 and "cancelled" in line and "no output" in line, line
    assert "FAILED_PRECONDITION" not in line and not (tmp_path / "x.mp4").exists()


@pytest.mark.timeout(120)
def test_a_render_cancelled_during_its_text_task_shows_no_stage_running(coordinator, store):
    rid = farm(coordinator, "submit", *SPEC).stdout.strip()
    held = store.lease("w-text", ["mlx"], 60_000)  # a worker holds the text task when the cancel comes
    assert held and held["id"].startswith(f"{rid}.text"), held
    assert farm(coordinator, "cancel", rid).returncode == 0
    stages = [line for line in farm(coordinator, "status", rid).stdout.splitlines() if line.startswith("    ")]
    assert stages and not any("running" in line for line in stages), stages
    assert any(line.split()[:3] == ["Text", "0/1", "cancelled"] for line in stages), stages
    store.complete(held["id"], "w-text", int(held["fence"]), {}, {})  # its result comes back unwanted
    stages = [line for line in farm(coordinator, "status", rid).stdout.splitlines() if line.startswith("    ")]
    assert stages and not any("running" in line for line in stages), stages


@pytest.mark.timeout(60)
def test_status_without_an_id_is_the_ls_list(coordinator):
    rids = [farm(coordinator, "submit", *SPEC, "--seed", str(seed)).stdout.strip() for seed in (1, 2)]
    status, listed = farm(coordinator, "status").stdout.splitlines(), farm(coordinator, "ls").stdout.splitlines()
    assert status[0] == listed[0], (status, listed)  # one header: the same columns, the same names
    assert status[0].split() == ["id", "state", "stage", "progress", "eta", "age", "by", "prompt"], status
    assert [r.split()[:3] for r in status[1:]] == [r.split()[:3] for r in listed[1:]], (status, listed)
    assert sorted(r.split()[0] for r in status[1:]) == sorted(rids), status


@pytest.mark.timeout(60)
def test_messages_carry_no_grpc_code_names_and_say_where_the_token_lives(coordinator):
    unknown = farm(coordinator, "status", "r-nope")
    line = one_line(unknown)
    assert unknown.returncode == 1 and "no render r-nope" in line and "NOT_FOUND" not in line, line
    bad = farm(coordinator, "status", token="wrong")
    line = one_line(bad)
    assert bad.returncode == 1 and "UNAUTHENTICATED" not in line, line
    assert "token" in line and "~/.ltx-farm/token" in line and "FARM_TOKEN" in line, line
    refused = farm(coordinator, "submit", "-p", "fox", "-H", "250")
    assert refused.returncode == 2 and "INVALID_ARGUMENT" not in refused.stderr, refused.stderr


@pytest.mark.timeout(60)
def test_workers_shows_chip_and_lost(coordinator, store):
    store.register_worker("studio", {"chip": "Apple M2 Ultra", "memory_bytes": 192 << 30, "fingerprint": "f2",
                                     "installed": {"lock": "10c", "installed": "5e7"}})
    store.register_worker("laptop", {"chip": "Apple M3 Max", "fingerprint": "f3"}, session="s1")
    store.lose_leases("laptop", session="s1", reason="cable cut")
    rows = {line.split()[0]: line for line in farm(coordinator, "workers").stdout.splitlines() if line.strip()}
    assert "Apple M2 Ultra" in rows["studio"] and "idle" in rows["studio"], rows
    assert "f2" in rows["studio"] and "5e7 (lock 10c)" in rows["studio"], rows  # its class and installed set
    assert "lost" in rows["laptop"] and "Apple M3 Max" in rows["laptop"], rows
    assert rows["2"].endswith("f2: studio; f3: laptop"), rows  # "2 determinism classes (...): ..."


@pytest.mark.timeout(60)
def test_doctor_reads_the_clock_of_the_coordinator_it_was_given(coordinator, tmp_data):
    result = farm(coordinator, "doctor", data=tmp_data)
    clock = next(line for line in result.stdout.splitlines() if "clock skew" in line)
    assert " ok " in clock and "clock skew vs coordinator" in clock, result.stdout
