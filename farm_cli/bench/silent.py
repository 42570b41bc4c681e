"""`farm bench silent`: how long a worker that goes silent keeps its lease.

A worker can vanish without a TCP reset: its Mac freezes or sleeps (here: SIGSTOP), or its packets stop
(here: a DROP rule in a network namespace of its own). Nothing then breaks its connection but HTTP/2
keepalive (protos/auth.py): the coordinator's ping goes unanswered, the Attach stream breaks and the
worker's leases go back to the queue (coordinator/api/presence.py). Each round waits for the worker to hold
a lease, silences it, and measures the seconds until the coordinator has taken the task back; then lets
the worker speak again (its late result is refused STALE) and goes on. The tests use the same pieces.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from farm_cli.bench.failover import wait_for
from farm_cli.client import FarmClient
from protos.states import TERMINAL

# Tiled stage 2 and a tiled decode: enough worker tasks for several silences per render.
SPEC = {"prompt": "a fox running through fresh snow", "height": 256, "width": 384, "frames": 25,
        "frame_rate": 24.0, "seed": 3, "pack": "tiny", "stage2_tiles": "2x2", "tile_overlap": 5,
        "decode_tiles": "32,256,256"}
NETNS_TOOLS = ("ip", "nft")


def held_by(farm: FarmClient, render_id: str, worker: str) -> dict | None:
    """The task of the render `worker` holds a lease of now, or None."""
    return next((t for t in farm.get(render_id)["tasks"] if t["state"] == "leased" and t.get("worker") == worker),
                None)


def _same_lease(farm: FarmClient, render_id: str, lease: dict) -> dict:
    return next(t for t in farm.get(render_id)["tasks"] if t["id"] == lease["id"])


@dataclass
class Silence:
    """One measured silence: the task the worker held, the seconds until the coordinator took it back."""

    task: str
    lost_s: float


def silence_once(farm: FarmClient, render_id: str, worker: str, silence: Callable[[], None],
                 speak: Callable[[], None], timeout: float = 30.0) -> Silence | None:
    """Wait for `worker` to hold a lease of the render, silence it, and time how long until its lease is
    gone (back in the queue). None when there was nothing to measure (the task finished just before the
    silence, or no lease came). `speak` always runs before this returns."""
    lease = wait_for(lambda: held_by(farm, render_id, worker), 120, 0.02)
    if not isinstance(lease, dict):
        return None
    silence()
    start = time.monotonic()
    try:
        now = wait_for(lambda: (t := _same_lease(farm, render_id, lease))["state"] != "leased"
                        or t.get("leased_ms") != lease.get("leased_ms"), timeout)
        took = time.monotonic() - start
        task = _same_lease(farm, render_id, lease)
    finally:
        speak()
    if not now or task["state"] == "done" and task.get("leased_ms") == lease.get("leased_ms"):
        return None
    return Silence(lease["id"], took)


def netns_missing() -> str:
    """Why a network namespace with a DROP rule cannot be made here ('' when it can)."""
    missing = [tool for tool in NETNS_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (iproute2 / nftables)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return ""


@dataclass
class Partition:
    """A network namespace joined to this one by a veth pair: the worker runs inside, drop() cuts it off
    silently (every packet in and out dropped by nft), allow() lifts it."""

    name: str = field(default_factory=lambda: f"farm-silent-{os.getpid()}")
    host_ip: str = "10.231.7.1"
    inner_ip: str = "10.231.7.2"

    @property
    def _veth(self) -> str:
        return f"fs{os.getpid() % 100000}"  # interface names end at 15 characters

    def __enter__(self) -> Partition:
        inside = ["ip", "netns", "exec", self.name]
        steps = [["ip", "netns", "add", self.name],
                 ["ip", "link", "add", f"{self._veth}h", "type", "veth", "peer", "name", f"{self._veth}n"],
                 ["ip", "link", "set", f"{self._veth}n", "netns", self.name],
                 ["ip", "addr", "add", f"{self.host_ip}/30", "dev", f"{self._veth}h"],
                 ["ip", "link", "set", f"{self._veth}h", "up"],
                 [*inside, "ip", "addr", "add", f"{self.inner_ip}/30", "dev", f"{self._veth}n"],
                 [*inside, "ip", "link", "set", f"{self._veth}n", "up"],
                 [*inside, "ip", "link", "set", "lo", "up"]]
        try:
            for step in steps:
                subprocess.run(step, check=True, capture_output=True, timeout=10)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=10)  # takes the pair
        subprocess.run(["ip", "link", "del", f"{self._veth}h"], capture_output=True, timeout=10)

    def wrap(self) -> list[str]:
        """The prefix that runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def drop(self) -> None:
        rules = (f"table inet farmsilent {{\n chain in {{ type filter hook input priority 0; iifname "
                 f"\"{self._veth}n\" drop; }}\n chain out {{ type filter hook output priority 0; oifname "
                 f"\"{self._veth}n\" drop; }}\n}}\n")
        subprocess.run([*self.wrap(), "nft", "-f", "-"], input=rules.encode(), check=True, capture_output=True,
                       timeout=10)

    def allow(self) -> None:
        subprocess.run([*self.wrap(), "nft", "delete", "table", "inet", "farmsilent"], check=True,
                       capture_output=True, timeout=10)


@contextlib.contextmanager
def one_worker_farm(store, data: Path, packs: Path, host: str = "127.0.0.1", wrap: list[str] | None = None,
                    name: str = "w1") -> Iterator[tuple[FarmClient, subprocess.Popen, Path]]:
    """The coordinator in this process on `host`, one worker process (inside `wrap`, e.g. a namespace)
    logging to DATA/NAME.log; the lease is the farm's default (30 s), so only keepalive can be quick."""
    from coordinator.api.auth import load_or_create_token
    from coordinator.server import serve, stop
    from farm_cli.services import worker_command

    token = load_or_create_token(data)
    server, port = serve(store, data, host, 0, token, expiry_interval_s=0.2)
    address = f"{host}:{port}"
    log_path = data / f"{name}.log"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [*(wrap or []), *worker_command(address, data / "token", packs, name, data / f"cache-{name}",
                                          wait_ms=500)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    client = FarmClient(address, token, timeout=30)
    try:
        yield client, proc, log_path
    finally:
        client.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stop(server)


def _rounds(farm: FarmClient, runs: int, silence: Callable[[], None], speak: Callable[[], None],
            echo: Callable[[str], None]) -> list[float]:
    times: list[float] = []
    render_id, seed = farm.submit(dict(SPEC)), 3
    while len(times) < runs:
        if farm.get(render_id)["state"] in TERMINAL:
            seed += 1
            render_id = farm.submit({**SPEC, "seed": seed})
        measured = silence_once(farm, render_id, "w1", silence, speak)
        if measured is None:
            continue
        times.append(measured.lost_s)
        echo(f"silence {len(times)}: {measured.task} back in the queue after {measured.lost_s:.2f} s")
    farm.cancel(render_id)
    return times


def run(mode: str, runs: int, data: Path | None) -> None:
    """Print each silence's seconds to the lost lease, then their median and max."""
    import typer

    from coordinator.state import redis_server
    from coordinator.state.store import FarmStore
    from farm_cli import common
    from farm_cli.services import ensure_tiny_pack

    if mode not in ("stop", "drop"):
        common.fail("--mode is stop (SIGSTOP) or drop (packets dropped in a network namespace)")
    if mode == "drop" and netns_missing():
        common.fail(f"--mode drop: {netns_missing()}")
    folder = common.data_dir(data)
    ensure_tiny_pack(folder)
    with contextlib.ExitStack() as stack:
        run_data = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="farm-bench-"))) / "data"
        run_data.mkdir()
        store = FarmStore(redis_server.connect(stack.enter_context(redis_server.EmbeddedRedis(run_data / "redis")).url))
        part = stack.enter_context(Partition()) if mode == "drop" else None
        host = part.host_ip if part else "127.0.0.1"
        farm, proc, _log = stack.enter_context(one_worker_farm(store, run_data, folder / "packs", host,
                                                               part.wrap() if part else None))
        if part:
            silence, speak = part.drop, part.allow
        else:
            silence, speak = (lambda: os.kill(proc.pid, signal.SIGSTOP)), (lambda: os.kill(proc.pid, signal.SIGCONT))
        times = _rounds(farm, runs, silence, speak, typer.echo)
    what = "SIGSTOP" if mode == "stop" else "packets dropped"
    typer.echo(f"silent worker ({what}): lease lost after median {statistics.median(times):.2f} s, "
               f"max {max(times):.2f} s over {len(times)} runs (goal <= 10 s; the lease is 30 s)")
