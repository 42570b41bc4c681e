"""`farm bench standby`: the Mac holding the Redis primary and the leading coordinator dies, in each phase.

A replicated set (primary, one replica, three sentinels; dead members come back as replicas), a leading
and a standby coordinator process on its sentinel URL, two workers and a `farm submit --wait` client
given both addresses, plus two renders submitted alongside so every phase comes round. At stage 2, at a
reducer step, during a decode tile and while assembling, the primary and the leader are killed -9
together (a Mac gone); the killed coordinator starts again as the next standby. Each kill measures the
seconds from the kill (Redis time) to the next lease, and checks that every task the store reported
done just before it is still done, with the same outputs, after the failover. At the end every render
is compared with `farm render --local` bit for bit. tests/farm/test_sentinel.py runs one round.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.state.redis_server import free_port
from farm_cli.supervise import stop_processes
from protos.kinds import TaskKind
from protos.states import TERMINAL

PHASES = ("stage2", "reducer", "decode", "assembling")
CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]
ROOT = Path(__file__).resolve().parents[2]
SEEDS = (3, 4, 5)  # the client's render, then two submitted alongside


def client_args(seed: int) -> list[str]:
    """`farm submit` flags: tiled stage 2 (tile tasks on workers, reducer steps on the coordinator), tiled decode."""
    return ["-p", "a fox", "-H", "256", "-W", "384", "-f", "25", "--seed", str(seed), "--pack", "tiny",
            "--stage2-tiles", "2x2", "--tile-overlap", "5", "--decode-tiles", "32,256,256"]


def client_spec(seed: int) -> dict:
    """The spec `farm submit client_args(seed)` sends, parsed by submit's own options."""
    from farm_cli.render_options import spec_of_args

    return spec_of_args(client_args(seed)).to_dict()


def _env(token: str = "") -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return env | ({"FARM_TOKEN": token} if token else {})


def start_coordinator(redis_url: str, data: Path, address: str, name: str) -> subprocess.Popen:
    """`farm coordinator` on `address`, logging to DATA/NAME.log."""
    cmd = [*CLI, "coordinator", "--redis-url", redis_url, "--data", str(data), "--port",
           address.rsplit(":", 1)[1], "--dashboard-port", "0"]
    with open(data / f"{name}.log", "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=_env())


def in_phase(store, phase: str) -> bool:
    """Whether some render is in `phase` right now (False while Redis fails over)."""
    try:
        if phase == "assembling":
            return any(r["state"] == "assembling" for r in store.list_renders())
        for tid in store.client.zrange(store.key("leases"), 0, -1):
            kind, capability = store.client.hmget(store.key("task", tid), "kind", "capability")
            if (phase == "stage2" and ".stage2." in tid and capability != "coordinator") \
                    or (phase == "reducer" and capability == "coordinator") or (phase == "decode" and kind == TaskKind.DECODE_TILE):
                return True
    except Exception:  # noqa: BLE001 - failing over
        return False
    return False


def done_tasks(store) -> dict[str, str]:
    """Every task the store reports done, with its outputs (what a failover must not lose)."""
    return {t["id"]: str(t.get("outputs")) for r in store.list_renders() for t in store.render_tasks(r["id"])
            if t["state"] == "done"}


def retry(fn: Callable[[], object], timeout: float = 60.0) -> object:
    """fn()'s first truthy answer, retried while it raises (a failover in progress) or answers falsy."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            answer = fn()
            if answer:
                return answer
        except Exception:  # noqa: BLE001 - Redis or the coordinator failing over
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"no answer within {timeout} s")
        time.sleep(0.02)


@dataclass
class Kill:
    phase: str
    redis_ms: int  # Redis time just before the kill
    leader_s: float = 0.0  # kill to the standby holding the leadership lease (its since_ms)
    lost: list[str] = field(default_factory=list)  # done before the kill, not done (or changed) after


class MacKiller(threading.Thread):
    """Waits for each phase in turn (the set whole again, a standby up), then kill -9s the Redis primary and
    the leading coordinator together, checks nothing acknowledged was lost and restarts that coordinator."""

    def __init__(self, farm: StandbyFarm) -> None:
        super().__init__(name="mac-killer", daemon=True)
        self.farm = farm
        self.kills: list[Kill] = []
        self.done = threading.Event()

    def _ready(self, phase: str) -> bool:
        try:
            whole = self.farm.store.redis_health().get("replicas_online", 0) >= 1
        except Exception:  # noqa: BLE001 - failing over
            return False
        return whole and self.farm.standby_up() and in_phase(self.farm.store, phase)

    def run(self) -> None:
        store = self.farm.store
        for phase in PHASES:
            while not self.done.is_set() and not self._ready(phase):
                time.sleep(0.005)
            if self.done.is_set():
                return
            before = done_tasks(store)
            kill = Kill(phase, int(retry(store.now_ms)))
            leader = self.farm.kill_mac()
            new = retry(lambda leader=leader: _new_leader(store, leader))
            kill.leader_s = (int(new["since_ms"]) - kill.redis_ms) / 1000
            after = retry(lambda: [done_tasks(store)])[0]
            kill.lost = [tid for tid, outs in before.items() if after.get(tid) != outs]
            self.kills.append(kill)
            self.farm.restart(leader)


def _new_leader(store, old: str) -> dict | None:
    """The leadership record once a coordinator other than `old` holds the lease."""
    leader = store.leader() or {}
    return leader if leader.get("address") not in (None, "", old) and leader.get("since_ms") else None


class StandbyFarm:
    """A replicated set, two coordinator processes (leader, standby) and two workers on one data folder."""

    def __init__(self, rs, data: Path, packs: Path) -> None:
        from coordinator.api.auth import load_or_create_token
        from coordinator.state.redis_server import connect
        from coordinator.state.store import FarmStore

        self.rs, self.data, self.packs = rs, data, packs
        self.token = load_or_create_token(data)
        self.store = FarmStore(connect(rs.url))
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]
        self.both = ",".join(self.addresses)
        self.procs: dict[str, subprocess.Popen] = {}
        self.others: list[subprocess.Popen] = []
        self.starts = 0

    def __enter__(self) -> StandbyFarm:
        from farm_cli.services import worker_command

        self._start(self.addresses[0])
        retry(lambda: self.store.leader()["address"] == self.addresses[0], 180)
        self._start(self.addresses[1])
        for name in ("w1", "w2"):
            cmd = worker_command(self.both, self.data / "token", self.packs, name, self.data / f"cache-{name}", 500)
            with open(self.data / f"{name}.log", "ab") as log:
                self.others.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT))
        return self

    def _start(self, address: str) -> None:
        self.starts += 1
        self.procs[address] = start_coordinator(self.rs.url, self.data, address, f"coord-{self.starts}")

    def standby_up(self) -> bool:
        """Both coordinator processes alive, one leading, the other's gRPC port answering (standing by)."""
        import socket

        try:
            leader = self.store.leader()["address"]
        except Exception:  # noqa: BLE001 - failing over
            return False
        for address in self.addresses:
            if address == leader:
                continue
            with socket.socket() as s, contextlib.suppress(OSError):
                s.settimeout(0.5)
                s.connect(("127.0.0.1", int(address.rsplit(":", 1)[1])))
                return self.procs[address].poll() is None
        return False

    def kill_mac(self) -> str:
        """kill -9 the Redis primary and the leading coordinator; returns that coordinator's address."""
        leader = str(retry(lambda: self.store.leader()["address"]))
        primary = self.rs.primary()
        primary.proc.kill()
        os.kill(self.procs[leader].pid, signal.SIGKILL)
        primary.proc.wait(10)
        self.procs[leader].wait(10)
        return leader

    def restart(self, address: str) -> None:
        """The killed coordinator's Mac is back: it starts again, as the standby."""
        self._start(address)

    def submit_wait(self, seed: int, out: Path) -> subprocess.Popen:
        cmd = [*CLI, "submit", *client_args(seed), "--wait", "-o", str(out), "--coordinator", self.both]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                env=_env(self.token))
        self.others.append(proc)
        return proc

    def __exit__(self, *exc: object) -> None:
        stop_processes([*self.others, *self.procs.values()])


def kill_to_lease(kills: list[Kill], tasks: list[dict]) -> list[float | None]:
    """Seconds from each kill to the first lease after it (None: no task was leased after it)."""
    leased = sorted(int(t.get("leased_ms") or 0) for t in tasks)
    return [next(((ms - k.redis_ms) / 1000 for ms in leased if ms > k.redis_ms), None) for k in kills]


@contextlib.contextmanager
def chaos_round(farm: StandbyFarm, out_dir: Path, stagger_s: float = 4.0) -> Iterator[RoundResult]:
    """One round: the client's render and two more, the Mac killed in each phase; yields once all finished."""
    from farm_cli.client import FarmClient

    result = RoundResult()
    seen = {r["id"] for r in farm.store.list_renders(1000)}
    killer = MacKiller(farm)
    client = farm.submit_wait(SEEDS[0], out_dir / f"client-{SEEDS[0]}.mp4")
    killer.start()
    with FarmClient(farm.both, farm.token, timeout=30) as api:
        for seed in SEEDS[1:]:
            time.sleep(stagger_s)
            result.ids[seed] = _submit_once(farm, api, seed, seen)
        try:
            stdout, result.client_err = client.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            client.kill()
            raise
        result.client_rc = client.returncode
        result.ids[SEEDS[0]] = str(retry(lambda: _new_render_of(farm, SEEDS[0], seen)))
        for seed, rid in result.ids.items():
            result.renders[seed] = _wait_done(api, rid, 600)
        killer.done.set()
        killer.join(60)
        result.kills = killer.kills
        tasks = [t for r in result.renders.values() for t in r["tasks"]]
        result.waits = kill_to_lease(killer.kills, tasks)
        result.api = api
        yield result


@dataclass
class RoundResult:
    ids: dict[int, str] = field(default_factory=dict)
    renders: dict[int, dict] = field(default_factory=dict)
    kills: list[Kill] = field(default_factory=list)
    waits: list[float | None] = field(default_factory=list)
    client_rc: int | None = None
    client_err: str = ""
    api: object = None  # the FarmClient on both addresses, while the round is open


def _new_render_of(farm: StandbyFarm, seed: int, seen: set[str]) -> str | None:
    """The round's render of this seed, if the store holds one: renders are told apart by their seed, since
    a submit cut by a kill may have landed or not."""
    return next((r["id"] for r in farm.store.list_renders(1000)
                 if r["id"] not in seen and (r.get("spec") or {}).get("seed") == seed), None)


def _submit_once(farm: StandbyFarm, api, seed: int, seen: set[str], timeout: float = 60.0) -> str:
    """Submit this seed's render during a failover, exactly once: a submit that failed may still have
    landed, so the store is asked for the render before each new try (never a duplicate to mistake)."""
    def attempt() -> str | None:
        return _new_render_of(farm, seed, seen) or api.submit(client_spec(seed))
    return str(retry(attempt, timeout))


def _wait_done(api, render_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            render = api.get(render_id)
            if render["state"] in TERMINAL:
                return render
        time.sleep(0.2)
    raise TimeoutError(f"{render_id} not done within {timeout} s")


def same_as_local(result: RoundResult, refs: dict, out_dir: Path) -> dict[int, bool]:
    """Per seed: done, every task output the same sha256 as --local's and the mp4's frames equal."""
    import av
    import numpy as np

    def frames(path: Path) -> list:
        with av.open(str(path)) as container:
            return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]

    verdicts = {}
    for seed, render in result.renders.items():
        rid, (local_mp4, local_outputs, _) = render["id"], refs[seed]
        farm_outs = {t["id"][len(rid) + 1:]: dict(t.get("outputs") or {}) for t in render["tasks"]}
        local = {tid[len("local") + 1:]: dict(outs) for tid, outs in local_outputs.items()}
        ok = render["state"] == "done" and farm_outs == local
        if ok:
            fa, fb = frames(result.api.fetch_output(rid, out_dir / f"{seed}.mp4")), frames(local_mp4)
            ok = len(fa) == len(fb) > 0 and all(np.array_equal(a, b) for a, b in zip(fa, fb, strict=True))
        verdicts[seed] = ok
    return verdicts


def run(rounds: int, data: Path | None) -> None:
    """Print each kill's phase, seconds to the next lease and lost transitions; per phase median and max."""
    import tempfile

    import typer

    from coordinator.state.replicated import ReplicatedRedis
    from farm_cli import common
    from farm_cli.local import render_local
    from farm_cli.services import ensure_tiny_pack
    from worker.runner import Runner

    folder = common.data_dir(data)
    ensure_tiny_pack(folder)
    waits: dict[str, list[float]] = {p: [] for p in PHASES}
    leads: dict[str, list[float]] = {p: [] for p in PHASES}
    verdicts: list[bool] = []
    with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp_name:
        tmp = Path(tmp_name)
        runner = Runner(folder / "packs")
        refs = {s: render_local(client_spec(s), tmp / f"local-{s}.mp4", runner) for s in SEEDS}
        (tmp / "data").mkdir()
        with ReplicatedRedis(tmp / "set", replicas=1, revive=True) as rs, \
                StandbyFarm(rs, tmp / "data", folder / "packs") as farm:
            for n in range(1, rounds + 1):
                (tmp / f"round-{n}").mkdir()
                with chaos_round(farm, tmp / f"round-{n}") as result:
                    same = same_as_local(result, refs, tmp / f"round-{n}")
                for kill, wait in zip(result.kills, result.waits, strict=True):
                    waits[kill.phase] += [wait] if wait is not None else []
                    leads[kill.phase].append(kill.leader_s)
                    typer.echo(f"round {n}: Mac killed at {kill.phase}: standby leads after {kill.leader_s:.2f} s, "
                               f"next task lease after {'-' if wait is None else f'{wait:.2f}'} s, "
                               f"lost transitions: {kill.lost or 'none'}")
                verdicts += list(same.values())
                typer.echo(f"round {n}: client exit {result.client_rc}; bit-identical to --local: {same}")
    for phase in PHASES:
        line = f"{phase}: kill -9 to the standby leading: {_spread(leads[phase])}; to the next task lease: "
        typer.echo(line + _spread(waits[phase]))
    typer.echo(f"renders bit-identical to --local: {sum(verdicts)}/{len(verdicts)}")


def _spread(seconds: list[float]) -> str:
    import statistics

    if not seconds:
        return "none measured"
    return f"median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s ({len(seconds)} kills)"
