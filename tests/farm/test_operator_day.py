"""An operator's day, second pass, through the real `farm` command and one `farm up` (a
coordinator, one worker process, the embedded Redis) shared by the module: a pack written into the
running farm's packs folder renders within seconds, a pack nobody has is refused at submit, Ctrl-C
during `submit --wait` leaves the render going with the fetch line, `farm rerun`, `farm logs` with a
lost lease that spends no attempt, and the messages that name a next step."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordinator.state.redis_server import free_port
from ltx_engine.fingerprint import forward_fingerprint
from protos import installed
from tests.farm.farm_harness import ROOT, wait_until

CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]
SMALL = ["-H", "256", "-W", "384", "-f", "25"]


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Farm:
    """`farm up` in a data folder, and the `farm` command run against it."""

    def __init__(self, root: Path, tiny_packs: Path) -> None:
        self.data, self.work = root / "data", root / "work"
        (self.data / "packs").mkdir(parents=True)
        self.work.mkdir()
        (self.data / "packs" / "tiny").symlink_to(tiny_packs / "tiny")
        self.port = free_port()
        (self.data / "config.toml").write_text(f'coordinator = "127.0.0.1:{self.port}"\n'
                                               f'output_dir = "{self.work / "out"}"\n')
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")} | {
            "FARM_DATA": str(self.data), "PYTHONPATH": str(ROOT)}
        self.log_path = root / "up.log"
        self.up: subprocess.Popen | None = None

    def __call__(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=self.work, env=self.env,
                              timeout=timeout)

    def popen(self, *args: str) -> subprocess.Popen:
        """`farm ARGS` as a process a test sends Ctrl-C to: SIGINT back at its default in the child, since a
        suite started in the background by a non-interactive shell hands its children SIGINT ignored (and
        Python then installs no KeyboardInterrupt), where a terminal's `farm` always has it."""
        return subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=self.work, env=self.env, preexec_fn=_sigint_default)

    def start(self) -> None:
        log = open(self.log_path, "w")  # noqa: SIM115 - the farm writes it until it stops
        self.up = subprocess.Popen([*CLI, "up", "--workers", "1", "--port", str(self.port), "--dashboard-port",
                                    str(free_port())], stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                   cwd=self.work)
        log.close()
        deadline = time.monotonic() + 120
        while "farm up: coordinator" not in self.log_path.read_text():
            assert self.up.poll() is None and time.monotonic() < deadline, self.log_path.read_text()
            time.sleep(0.3)

    def stop(self) -> None:
        if self.up is not None:
            self.up.terminate()
            self.up.wait(timeout=60)

    def worker_packs(self) -> dict[str, list[str]]:
        rows = json.loads(self("workers", "--json").stdout or "[]")
        return {w["id"]: sorted(w.get("packs") or {}) for w in rows if w.get("state") in ("idle", "busy")}

    def worker_pid(self, name: str) -> int | None:
        """The pid of the worker process `farm up` started as `name` (its command line names our folder)."""
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"worker.agent" in argv and name.encode() in argv and str(self.data / "packs").encode() in argv:
                return int(proc.name)
        return None


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, tiny_packs: Path):
    farm = Farm(tmp_path_factory.mktemp("day"), tiny_packs)
    farm.start()
    try:
        yield farm
    finally:
        farm.stop()


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


@pytest.mark.timeout(300)
def test_a_pack_written_into_a_running_farm_renders_without_a_restart(up: Farm) -> None:
    """The running worker's folder watch registers the new pack: the same process, no restart (how soon is
    a figure for a bench, not this test: the margin below only bounds a hang)."""
    wait_until(lambda: up.worker_packs().get("worker-1"), 60, "worker-1 registered")
    pid = up.worker_pid("worker-1")
    wrote = up("pack", "tiny", str(up.data / "packs" / "mine"))
    assert wrote.returncode == 0, wrote.stderr
    written = time.monotonic()
    wait_until(lambda: "mine" in up.worker_packs().get("worker-1", []), 120, "worker-1 registers mine")
    noticed_s = time.monotonic() - written
    assert pid is not None and up.worker_pid("worker-1") == pid  # taken while running, not by a restart
    config = {line.split()[0]: line for line in up("config").stdout.splitlines()}
    assert "tiny" in config["pack"] and "(default)" in config["pack"], config  # it did not become the default

    done = up("submit", "-p", "a lantern in the fog", *SMALL, "--pack", "mine", "--wait", "-o",
              str(up.work / "mine.mp4"))
    assert done.returncode == 0 and (up.work / "mine.mp4").stat().st_size > 1000, done.stderr[-3000:]
    rendered_s = time.monotonic() - written
    print(f"pack noticed {noticed_s:.1f} s after its write; rendered {rendered_s:.1f} s after it")

    nobody = up("submit", "-p", "x", *SMALL, "--pack", "nobody-has-this")
    assert nobody.returncode == 2 and "no registered worker has it" in one_line(nobody), nobody.stderr
    assert not any("x" == r.get("prompt") for r in json.loads(up("status", "--json").stdout))  # nothing queued

    shutil.rmtree(up.data / "packs" / "mine")  # a pack that disappears is dropped the same way
    wait_until(lambda: "mine" not in up.worker_packs().get("worker-1", ["mine"]), 20, "worker-1 drops mine")


def kill_mid_task(up: Farm, rid: str, leased) -> str:
    """SIGKILL worker-1 while it holds a task of the render (`farm up` starts it again); the task whose
    lease was lost."""
    for _ in range(20):
        task = wait_until(leased, 120, "a task of the render leased")
        os.kill(wait_until(lambda: up.worker_pid("worker-1"), 30, "worker-1 running"), signal.SIGKILL)
        time.sleep(1.0)
        tasks = json.loads(up("status", rid, "--json").stdout)["tasks"]
        lost = [t["id"] for t in tasks if int(t.get("lost") or 0)]
        if lost:
            return lost[0]
        assert task  # the task ended just before the kill: take the next one
    raise AssertionError("no lease of the render was lost")


@pytest.mark.timeout(400)
def test_ctrl_c_leaves_the_render_going_and_logs_show_the_lost_lease(up: Farm) -> None:
    submit = up.popen("submit", "-p", "a paper crane", *SMALL, "--seed", "4", "--wait", "-o", "crane.mp4")
    rid = submit.stdout.readline().strip()
    assert rid.startswith("r"), (rid, submit.stderr.read() if submit.poll() is not None else "")

    def leased() -> str | None:
        render = json.loads(up("status", rid, "--json").stdout)
        return next((t["id"] for t in render.get("tasks") or [] if t.get("state") == "leased"), None)

    wait_until(leased, 120, "a task of the render leased")
    submit.send_signal(signal.SIGINT)
    _out, err = submit.communicate(timeout=30)
    assert submit.returncode == 130, err[-3000:]
    said = err.strip().splitlines()[-1]
    assert "goes on" in said and f"farm fetch {rid} -o crane.mp4" in said, err[-3000:]

    lost = kill_mid_task(up, rid, leased)  # the worker dies mid-task: its lease is lost, no attempt spent
    watched = up("watch", rid, timeout=300)
    assert watched.returncode == 0, watched.stdout[-2000:] + watched.stderr[-2000:]
    assert f"farm fetch {rid} -o " in watched.stdout.strip().splitlines()[-1], watched.stdout  # where the output is

    logs = up("logs", rid).stdout
    assert "attempt 2" not in logs and f"== {lost}  done on worker-1" in logs, logs
    block = logs.split(f"== {lost}  ")[1].split("\n== ")[0]
    assert "earlier: lost with worker-1 (no attempt spent)" in block, logs
    status = up("status", rid).stdout
    assert "attempt 2" not in status, status

    again = up("rerun", rid, "--seed", "11")
    assert again.returncode == 0 and again.stdout.strip().startswith("r"), again.stderr
    new = again.stdout.strip()
    spec = json.loads(up("status", new, "--json").stdout)["spec"]
    old = json.loads(up("status", rid, "--json").stdout)["spec"]
    assert new != rid and spec["seed"] == 11 and spec["prompt"] == old["prompt"] and spec["height"] == 256
    assert up("cancel", new).returncode == 0


@pytest.mark.timeout(120)
def test_listings_have_headers_and_workers_say_what_they_are(up: Farm) -> None:
    listing = up("status").stdout.splitlines()
    assert listing[0].split()[:3] == ["id", "state", "stage"], listing
    workers = up("workers").stdout.splitlines()
    assert workers[0].split() == ["worker", "state", "chip", "memory", "packs", "versions", "class", "installed",
                                  "task", "speed"], workers
    row = next(line for line in workers if line.startswith("worker-1"))
    assert "tiny" in row and "GiB" in row and ("s/task" in row or "no tasks yet" in row), workers
    assert forward_fingerprint() in row and installed.installed_set()["installed"] in row, workers

    plan = up("plan", "-p", "a fox", *SMALL, "--pack", "tiny")
    assert plan.returncode == 0, plan.stderr
    assert "0.0 GiB" not in plan.stdout and "MiB" in plan.stdout, plan.stdout
    assert "decode tiles none (the clip is decoded whole)" in plan.stdout, plan.stdout
    rows = [line for line in plan.stdout.splitlines() if re.search(r"\d\.\ds +\d+\.\ds", line)]
    ends = {re.search(r"\d\.\ds +\d+\.\ds", line).end() for line in rows}
    assert len(rows) >= 5 and len(ends) == 1, plan.stdout  # every stage's seconds in one column


@pytest.mark.timeout(120)
def test_refusals_at_the_coordinator_name_the_fix(up: Farm) -> None:
    tall = up("submit", "-p", "x", "-H", "250", "-W", "384", "-f", "25")
    assert tall.returncode == 2 and "try 256" in one_line(tall), tall.stderr
    tiles = up("submit", "-p", "x", *SMALL, "--stage2-tiles", "9x9")
    line = one_line(tiles)
    assert tiles.returncode == 2 and "256x384 px" in line and "160 px" in line and "--stage2-tiles" in line, line
    assert "latent cells of 32 px" in line
    folder = up("submit", "-p", "x", *SMALL, "--pack", str(up.data / "packs" / "tiny"))
    line = one_line(folder)
    assert folder.returncode == 2 and "packs folder" in line and "--pack tiny" in line, line


@pytest.mark.timeout(240)
def test_a_render_waiting_for_a_pack_shows_the_copy_under_way(up: Farm) -> None:
    laptop_packs = up.data.parent / "laptop-packs"
    laptop_packs.mkdir()
    log = open(up.data.parent / "laptop.log", "w")  # noqa: SIM115 - the worker writes it until it stops
    laptop = subprocess.Popen([*CLI, "worker", "--coordinator", f"127.0.0.1:{up.port}", "--token-file",
                               str(up.data / "token"), "--packs-dir", str(laptop_packs), "--worker-id", "laptop",
                               "--cache-dir", str(up.data.parent / "laptop-cache"), "--wait-ms", "500",
                               "--pack-max-mbps", "0.5"], stdout=log, stderr=subprocess.STDOUT, env=up.env,
                              cwd=up.work)
    log.close()
    try:
        wait_until(lambda: "laptop" in up.worker_packs(), 60, "laptop registered")
        assert up("pack", "tiny", str(up.data / "packs" / "shelved")).returncode == 0  # on the coordinator only
        rid = up("submit", "-p", "a owl", *SMALL, "--pack", "shelved").stdout.strip()

        def copy_line() -> str | None:
            out = up("status", rid).stdout
            return next((line for line in out.splitlines() if "laptop is copying pack shelved" in line), None)

        line = wait_until(copy_line, 60, "farm status shows laptop's copy")
        assert re.search(r"\d+% \(\d+\.\d of \d+\.\d MB\)", line), line
        assert up("cancel", rid).returncode == 0
    finally:
        laptop.terminate()
        laptop.wait(timeout=30)


@pytest.mark.timeout(120)
def test_ctrl_c_during_a_batch_wait_names_the_group(up: Farm) -> None:
    batch = up.popen("submit", "-p", "a kite", *SMALL, "--seeds", "1-2", "--wait", "-o", "kites")
    group, *ids = (batch.stdout.readline().strip() for _ in range(3))
    assert group.startswith("g") and all(i.startswith("r") for i in ids), (group, ids)
    time.sleep(1.0)  # following has begun
    batch.send_signal(signal.SIGINT)
    _out, err = batch.communicate(timeout=30)
    said = err.strip().splitlines()[-1]
    assert batch.returncode == 130 and f"group {group}" in said and f"farm fetch {group} -o kites" in said, err
    for rid in ids:
        assert up("cancel", rid).returncode == 0  # they went on until now
