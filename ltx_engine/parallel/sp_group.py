"""Opening an `mx.distributed` ring group for a sequence-parallel forward, and a local launcher.

A ring group is k processes, each told its rank (`MLX_RANK`) and a JSON hostfile of every rank's
"host:port" in rank order (`MLX_HOSTFILE`); rank r listens on its own entry and connects to the
others. A ring whose peer freezes blocks forever, so `run_ring` (k processes on 127.0.0.1, what the
parity tests and `farm bench sp` run) kills every rank when the deadline passes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx


def open_ring(rank: int, hostfile: str | Path) -> mx.distributed.Group:
    """Join the ring whose JSON hostfile lists every rank's "host:port" in rank order, as `rank`."""
    hosts = json.loads(Path(hostfile).read_text())
    os.environ["MLX_RANK"] = str(rank)
    os.environ["MLX_HOSTFILE"] = str(hostfile)
    group = mx.distributed.init(strict=True, backend="ring")
    if group.size() != len(hosts) or group.rank() != rank:
        raise RuntimeError(f"ring group rank {group.rank()}/{group.size()}, expected {rank}/{len(hosts)}")
    return group


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n ports free right now on `host` (bound together, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass(frozen=True)
class RankResult:
    rank: int
    returncode: int | None  # None: killed (see `ended`)
    output: str
    ended: str = "exited"  # "exited" by itself; killed at the "deadline"; killed once a "peer failed"


def run_ring(argv: list[str], k: int, timeout_s: float, env: dict | None = None,
             cwd: str | Path | None = None) -> list[RankResult]:
    """Run `argv + [rank, hostfile]` as k processes forming a ring on 127.0.0.1.

    Every process gets its rank and the hostfile path as its last two arguments; when one is still
    running at the deadline, all are killed (their own process groups) and report returncode None."""
    hosts = [f"127.0.0.1:{p}" for p in free_ports(k)]
    folder = Path(tempfile.mkdtemp(prefix="ltx-ring-"))
    hostfile = folder / "hosts.json"
    hostfile.write_text(json.dumps(hosts))
    procs, logs = [], []
    for rank in range(k):
        log = open(folder / f"rank{rank}.log", "w+")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(subprocess.Popen([*argv, str(rank), str(hostfile)], stdout=log, stderr=subprocess.STDOUT,
                                      env=env, cwd=cwd, start_new_session=True))
    codes, cause = _wait_all(procs, time.monotonic() + timeout_s)
    results = []
    for rank, (log, code) in enumerate(zip(logs, codes, strict=True)):
        log.seek(0)
        results.append(RankResult(rank, code, log.read(), "exited" if code is not None else cause))
        log.close()
    return results


EXIT_GRACE_S = 2.0  # a failed rank's peers that are already exiting (the ring's sockets closed) finish on their own


def _let_exiting_ranks_finish(procs: list[subprocess.Popen], until: float) -> None:
    """A rank that failed may be seen before a peer whose exit closed the ring (Python's teardown after
    `sys.exit` outlasts the sockets): wait briefly, so that peer reports its own code, not a kill."""
    while time.monotonic() < until and any(p.poll() is None for p in procs):
        time.sleep(0.05)


def _wait_all(procs: list[subprocess.Popen], deadline: float) -> tuple[list[int | None], str]:
    """Return codes once all exit; at the deadline, or as soon as one fails (its peers would block in
    a collective forever), the ones still running are killed and read None. Also which of the two
    killed them ("deadline" or "peer failed"), so a caller can tell a quick end from a timeout."""
    cause = "deadline"
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        if any(c not in (None, 0) for c in codes):
            cause = "peer failed"
            _let_exiting_ranks_finish(procs, min(deadline, time.monotonic() + EXIT_GRACE_S))
            break
        time.sleep(0.05)
    codes = [p.poll() for p in procs]
    for p, code in zip(procs, codes, strict=True):
        if code is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return codes, cause
