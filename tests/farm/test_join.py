"""`farm join TOKEN` as a second Mac meets it: the farm found by mDNS on a LAN (loopback with multicast
on, inside a network namespace the test makes, so nothing leaks onto this machine's network), the
right farm picked by the token when two announce, the joined worker rendering through the farm, a
wrong or rotated token refused in one line, and the service unit that brings the worker back."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from coordinator.state.redis_server import free_port
from farm_cli.service_unit import LABEL, service_unit
from protos.discovery import zeroconf_missing
from tests.farm.farm_harness import ROOT

FARM = [sys.executable, "-c", "from farm_cli.main import main; main()"]
WRONG_FARM = "LTXF1." + "0" * 64 + ".not-this-farm"


def _missing() -> str:
    if shutil.which("ip") is None:
        return "ip (iproute2) not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return zeroconf_missing()


def _need_namespace() -> None:
    missing = _missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the farm join test: {missing}")
        pytest.skip(missing)


def _env(data: Path) -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "FARM_DATA": str(data), "PYTHONPATH": path, "FARM_ANNOUNCE": "1"}


def _one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


@dataclass
class Namespace:
    """A network namespace with only loopback, up and multicast on: a LAN of one host."""

    name: str
    procs: list[subprocess.Popen]

    def run(self, *args: str, data: Path, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.name, *FARM, *args], capture_output=True, text=True,
                              timeout=timeout, env=_env(data), cwd=ROOT)

    def start(self, *args: str, data: Path, log: Path) -> subprocess.Popen:
        with open(log, "ab") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", self.name, *FARM, *args], stdout=out,
                                    stderr=subprocess.STDOUT, env=_env(data), cwd=ROOT)
        self.procs.append(proc)
        return proc


@pytest.fixture
def lan() -> Iterator[Namespace]:
    _need_namespace()
    ns = Namespace(f"farm-join-{os.getpid()}", [])
    subprocess.run(["ip", "netns", "add", ns.name], check=True)
    try:
        for step in (["ip", "link", "set", "lo", "up"], ["ip", "link", "set", "lo", "multicast", "on"]):
            subprocess.run(["ip", "netns", "exec", ns.name, *step], check=True)
        yield ns
    finally:
        for proc in ns.procs:
            proc.terminate()
        for proc in ns.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        subprocess.run(["ip", "netns", "del", ns.name], check=False)


def _coordinator(ns: Namespace, data: Path) -> str:
    """A coordinator announcing itself in the namespace (as `farm coordinator` does by default)."""
    port = free_port()
    log = data.parent / f"{data.name}.log"
    data.mkdir(parents=True)
    proc = ns.start("coordinator", "--data", str(data), "--port", str(port), "--dashboard-port",
                    str(free_port()), data=data, log=log)
    deadline = time.monotonic() + 120
    while "coordinator on" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    return f"127.0.0.1:{port}"


def _wait_for_worker(ns: Namespace, address: str, data: Path, name: str, joined: subprocess.Popen,
                     log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        listed = ns.run("workers", "--coordinator", address, "--token-file", str(data / "token"), data=data)
        if name in listed.stdout:
            return
        assert joined.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)


@pytest.mark.timeout(600)
def test_join_finds_its_farm_among_two_and_its_worker_renders(lan: Namespace, tmp_path: Path) -> None:
    from ltx_engine.tiny.tiny_pack import write_tiny_pack

    other = _coordinator(lan, tmp_path / "other-farm")  # a second farm announcing on the same LAN
    farm_data = tmp_path / "farm"
    address = _coordinator(lan, farm_data)
    write_tiny_pack(farm_data / "packs" / "tiny", seed=0)
    token = (farm_data / "token").read_text().strip()
    mac = tmp_path / "second-mac"

    planned = lan.run("join", token, "--service", "--dry-run", "--data", str(mac), data=mac)
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert f"found the farm at {address}" in planned.stdout
    assert "ltx-farm-worker.service" in planned.stdout and "join --token-file" in planned.stdout
    assert "systemctl --user enable --now" in planned.stdout
    assert not (mac / "token").exists()  # a dry run changes nothing

    log = tmp_path / "join.log"
    joined = lan.start("join", token, "--worker-id", "second-mac", "--data", str(mac), data=mac, log=log)
    _wait_for_worker(lan, address, farm_data, "second-mac", joined, log)
    assert (mac / "token").read_text().strip() == token
    assert (mac / "token").stat().st_mode & 0o777 == 0o600
    assert f"found the farm at {address}" in log.read_text()

    made = lan.run("render", "-p", "a fox in snow", "-H", "128", "-W", "128", "-f", "9", "-o",
                   str(tmp_path / "fox.mp4"), "--coordinator", address, "--token-file", str(farm_data / "token"),
                   data=farm_data, timeout=400)
    assert made.returncode == 0, made.stderr[-3000:] + log.read_text()[-3000:]
    assert (tmp_path / "fox.mp4").stat().st_size > 500
    render_id = made.stdout.strip().splitlines()[0]
    logs = lan.run("logs", render_id, "--coordinator", address, "--token-file", str(farm_data / "token"),
                   data=farm_data)
    assert "second-mac" in logs.stdout, logs.stdout[-3000:]  # the joined worker ran the tiles
    decoy = lan.run("workers", "--coordinator", other, "--token-file", str(tmp_path / "other-farm" / "token"),
                    data=tmp_path / "other-farm")
    assert "second-mac" not in decoy.stdout


@pytest.mark.timeout(300)
def test_a_wrong_or_rotated_token_is_refused_in_one_line(lan: Namespace, tmp_path: Path) -> None:
    farm_data = tmp_path / "farm"
    _coordinator(lan, farm_data)
    old = (farm_data / "token").read_text().strip()
    mac = tmp_path / "mac"

    wrong = lan.run("join", WRONG_FARM, "--data", str(mac), data=mac)
    assert wrong.returncode == 2
    assert "no farm on this network announces this token's CA (1 other farm seen)" in _one_line(wrong)

    rotated = lan.run("token", "rotate", "--data", str(farm_data), data=farm_data)
    assert rotated.returncode == 0, rotated.stderr
    stale = lan.run("join", old, "--data", str(mac), data=mac)
    assert stale.returncode == 2
    assert "refuses this token's secret" in _one_line(stale)
    assert not (mac / "token").exists()  # nothing saved for a refused token


@pytest.mark.timeout(60)
def test_a_damaged_token_is_refused_before_any_network(tmp_path: Path) -> None:
    result = subprocess.run([*FARM, "join", "LTXF1.abc.x", "--data", str(tmp_path)], capture_output=True,
                            text=True, timeout=60, env=_env(tmp_path), cwd=ROOT)
    assert result.returncode == 2
    assert "farm token is damaged" in _one_line(result)


@pytest.mark.timeout(60)
def test_the_service_runs_join_at_every_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unit files `farm join --service` writes: launchd keeps the agent alive from login, systemd
    restarts the user unit; both run `farm join` with the saved token file, never the token itself."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    home, farm_home = tmp_path / "home", tmp_path / "farm-home"
    args = ["join", "--token-file", str(farm_home / "token")]

    unit = service_unit(farm_home, args, platform="linux", home=home)
    unit.write()
    assert unit.path == tmp_path / "config" / "systemd" / "user" / "ltx-farm-worker.service"
    text = unit.path.read_text()
    assert f"join --token-file {farm_home / 'token'}" in text and "__" not in text
    assert "Restart=always" in text and "WantedBy=default.target" in text
    assert ["systemctl", "--user", "enable", "--now", "ltx-farm-worker.service"] in unit.activate

    agent = service_unit(farm_home, args, platform="darwin", home=home)
    agent.write()
    assert agent.path == home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    plist = plistlib.loads(agent.path.read_bytes())
    assert plist["ProgramArguments"][-3:] == args
    assert plist["RunAtLoad"] and plist["KeepAlive"]
    assert plist["EnvironmentVariables"]["FARM_DATA"] == str(farm_home)
    assert plist["StandardOutPath"] == str(farm_home / "logs" / "worker.log")
