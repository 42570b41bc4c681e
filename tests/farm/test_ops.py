"""ops/ files are valid (plists parse, the unit parses, redis.conf runs a real redis-server with AOF), the
install script's dry run works under bash, and `farm doctor` checks against a real coordinator."""

from __future__ import annotations

import configparser
import os
import plistlib
import subprocess
import time
from pathlib import Path

import pytest
import redis
import typer
from typer.testing import CliRunner

from coordinator.state.redis_server import find_redis_server
from farm_cli import doctor

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ops"


@pytest.mark.parametrize("name", ["com.ltxfarm.worker.plist", "com.ltxfarm.coordinator.plist"])
def test_launchd_plists_parse(name: str) -> None:
    plist = plistlib.loads((OPS / "launchd" / name).read_bytes())
    assert plist["Label"] == name.removesuffix(".plist")
    assert plist["KeepAlive"] is True and plist["RunAtLoad"] is True
    assert plist["ProgramArguments"][0] == "__FARM_BIN__" and plist["StandardErrorPath"].endswith(".log")


def test_install_worker_dry_run_renders_a_valid_plist(tmp_path: Path) -> None:
    script = OPS / "install-worker.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    proc = subprocess.run(
        [
            "bash",
            str(script),
            "--dry-run",
            "--coordinator",
            "studio.local:8471",
            "--home",
            str(tmp_path / "farm"),
            "--worker-id",
            "mini-2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FARM_TOKEN": "t0k"},  # the token never rides on a command line
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "pip install" in out and "launchctl bootstrap" in out and "pack pull" not in out
    assert f"-c {OPS / '..' / 'requirements.lock'}" in out  # every Mac installs the locked set
    assert "copies ltx-2.3-mlx-q8 from the coordinator" in out and "--pack ltx-2.3-mlx-q8" in out  # never the hub
    assert "nothing was changed" in out and not (tmp_path / "farm").exists()
    xml = "\n".join(line[4:] for line in out.splitlines() if line.startswith("    "))
    plist = plistlib.loads(xml.encode())
    args = plist["ProgramArguments"]
    assert args[:4] == [
        str(tmp_path / "farm" / "venv" / "bin" / "farm"),
        "worker",
        "--coordinator",
        "studio.local:8471",
    ]
    assert args[args.index("--worker-id") + 1] == "mini-2" and "__" not in "".join(map(str, plist.values()))
    assert subprocess.run(["bash", str(script), "--bogus"], capture_output=True).returncode == 2
    on_argv = subprocess.run(["bash", str(script), "--dry-run", "--token", "t"], capture_output=True, text=True)
    assert on_argv.returncode == 2 and len(on_argv.stderr.strip().splitlines()) == 1 and "ps" in on_argv.stderr
    pulled = subprocess.run(["bash", str(script), "--dry-run", "--token-file", str(tmp_path / "t"), "--home",
                             str(tmp_path / "farm"), "--pack", "dgrauet/ltx-2.3-mlx-q8"], capture_output=True,
                            text=True, timeout=60)
    assert pulled.returncode == 0, pulled.stderr  # a Mac that must stand alone pulls only what renders load
    assert f"pack pull dgrauet/ltx-2.3-mlx-q8 --kinds t2v\\,i2v --packs-dir {tmp_path / 'farm' / 'packs'}" in pulled.stdout


def test_systemd_unit_parses() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(OPS / "systemd" / "ltx-farm-coordinator.service")
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    assert "farm coordinator" in unit["Service"]["ExecStart"] and unit["Service"]["Restart"] == "on-failure"


def test_redis_conf_runs_with_aof_everysec(tmp_path: Path) -> None:
    sock = tmp_path / "r.sock"
    proc = subprocess.Popen(
        [
            str(find_redis_server()),
            str(OPS / "redis" / "redis.conf"),
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--dir",
            str(tmp_path),
            "--supervised",
            "no",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sock.exists(), proc.stdout.read().decode() if proc.poll() is not None else "no socket"
        client = redis.Redis(unix_socket_path=str(sock), decode_responses=True)
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("appendfsync")["appendfsync"] == "everysec"
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        client.set("k", "v")
        client.shutdown()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert any(tmp_path.rglob("farm.aof*"))


def test_doctor_checks(store, tmp_data: Path) -> None:
    from coordinator.dashboard import start_dashboard, stop_dashboard
    from coordinator.server import serve, stop
    from ltx_engine.tiny.tiny_pack import write_tiny_pack
    from tests.farm.farm_harness import join_token

    packs = tmp_data / "packs"
    write_tiny_pack(packs / "tiny", seed=0)
    assert doctor.check_python()[0] == "ok"
    assert doctor.check_mlx()[0] in ("ok", "warn")
    assert doctor.check_pack("tiny", packs)[0] == "ok"
    assert doctor.check_pack("nope", packs)[0] == "fail"
    (packs / "tiny" / "vocoder.safetensors").unlink()
    status, message = doctor.check_pack("tiny", packs)
    assert status == "fail" and "vocoder" in message
    server, port = serve(store, tmp_data, "127.0.0.1", 0, "right-token")
    right = join_token(tmp_data, "right-token")  # the farm's CA pinned, its secret
    (tmp_data / "right.token").write_text(right)  # a client names a token file, never the token itself
    dash, dport = start_dashboard(store, port=0)
    try:
        assert doctor.check_coordinator(f"127.0.0.1:{port}", right)[0] == "ok"
        status, message = doctor.check_coordinator(f"127.0.0.1:{port}", right[:-1])
        assert status == "fail" and "refused the farm token" in message
        status, message = doctor.check_clock(f"http://127.0.0.1:{dport}")
        assert status == "ok" and "clock skew" in message
        assert doctor.check_clock("http://127.0.0.1:9")[0] == "skip"
        empty = tmp_data / "new-mac-packs"  # a worker that has no pack yet: the coordinator holds it
        status, message = doctor.check_pack("tiny", empty, doctor.farm_packs(f"127.0.0.1:{port}", right))
        assert status == "ok" and "the coordinator holds it" in message
        status, message = doctor.check_pack("nope", empty, doctor.farm_packs(f"127.0.0.1:{port}", right))
        assert status == "fail" and "nor on the coordinator" in message
        status, message = doctor.check_pack("tiny", empty, doctor.farm_packs(f"127.0.0.1:{port}", right[:-1]))
        assert status == "fail" and "coordinator not asked" in message
        app = typer.Typer()
        app.command()(lambda: None)  # a second command keeps `doctor` a named subcommand
        app.command()(doctor.doctor)  # as farm_cli.main registers it
        result = CliRunner().invoke(
            app,
            [
                "doctor",
                "--coordinator",
                f"127.0.0.1:{port}",
                "--token-file",
                str(tmp_data / "right.token"),
                "--data",
                str(tmp_data),
                "--dashboard",
                f"http://127.0.0.1:{dport}",
            ],
        )
        lines = result.output.strip().splitlines()
        # python, mlx, installed set, pack, text encoder, coordinator, clock, logs; the pack lost its vocoder above
        assert len(lines) == 8 and result.exit_code == 1, result.output
        assert lines[2].startswith("✓ ok") and "installed set" in lines[2]
        assert lines[3].startswith("✗ fail") and "vocoder" in lines[3]
        assert lines[4].startswith("✓ ok") and "carries its own" in lines[4]
        assert lines[5].startswith("✓ ok") and "answers with this token" in lines[5]
    finally:
        stop_dashboard(dash)
        stop(server)
