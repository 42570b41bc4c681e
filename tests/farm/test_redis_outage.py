"""Redis kill -9 (AOF on) and restart under real renders, once in each phase (stage 1, a reducer step, a
decode tile, assembling): every render finishes without restarting the coordinator, byte-identical to
`farm render --local`, and `farm submit --wait` (its own process) exits 0 with the mp4. The coordinator's
loops log one line when an outage starts and one when it ends, not one per retry."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

import pytest

from coordinator.state.redis_server import EmbeddedRedis, connect, free_port
from coordinator.state.store import FarmStore
from tests.farm.chaos import ChaosFarm, assert_same_outputs, assert_same_video, spec
from tests.farm.farm_harness import ROOT, wait_done

PHASES = ("stage1", "reducer", "decode", "assembling")


def _in_phase(store: FarmStore, phase: str) -> bool:
    """Whether some render is in `phase` right now (False while Redis is away)."""
    try:
        if phase == "assembling":
            return any(r["state"] == "assembling" for r in store.list_renders())
        for tid in store.client.zrange(store.key("leases"), 0, -1):
            t = store.client.hmget(store.key("task", tid), "kind", "capability")
            if (phase == "stage1" and tid.endswith(".stage1")) or (phase == "reducer" and t[1] == "coordinator") \
                    or (phase == "decode" and t[0] == "decode_tile"):
                return True
    except Exception:  # noqa: BLE001 - Redis restarting
        return False
    return False


class RedisKiller(threading.Thread):
    """Waits for each phase in turn, then kill -9s redis-server and starts it again on the same AOF."""

    def __init__(self, server: EmbeddedRedis, store: FarmStore, down_s: float = 1.0) -> None:
        super().__init__(name="redis-killer", daemon=True)
        self.server, self.store, self.down_s = server, store, down_s
        self.hit: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        for phase in PHASES:
            while not self.done.is_set() and not _in_phase(self.store, phase):
                time.sleep(0.005)
            if self.done.is_set():
                return
            self.server.proc.kill()
            self.server.proc.wait(10)
            self.hit.append(phase)
            time.sleep(self.down_s)
            self.server.start()


@pytest.mark.timeout(420)
def test_redis_killed_in_every_phase_renders_finish_identical(local_reference, tmp_path, tiny_packs, caplog):
    caplog.set_level(logging.INFO)
    refs = {s: local_reference(spec(s)) for s in (0, 1, 2)}  # distinct seeds: a result in the wrong render shows
    redis = EmbeddedRedis(tmp_path / "redis", unix_socket=False, port=free_port(), persistence=True).start()
    store = FarmStore(connect(redis.url))
    data = tmp_path / "data"
    data.mkdir()
    try:
        with ChaosFarm(store, data, tiny_packs, workers=3, lease_ms=6000) as farm:
            killer = RedisKiller(redis, store)
            ids = {0: farm.client.submit(spec(0))}
            killer.start()
            cli = subprocess.Popen(
                [sys.executable, "-c", "from farm_cli.main import main; main()", "submit", "-p", "a fox", "-H", "128",
                 "-W", "256", "-f", "9", "--seed", "1", "--stage2-tiles", "2x2", "--tile-overlap", "1",
                 "--decode-tiles", "32,128,128", "--coordinator", farm.address, "--wait",
                 "-o", str(tmp_path / "wait.mp4"), "--json"],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "FARM_TOKEN": farm.token}, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True)
            time.sleep(2.0)
            ids[2] = farm.client.submit(spec(2))
            out, err = cli.communicate(timeout=300)
            for rid in ids.values():
                wait_done(farm.client, rid, 300)
            killer.done.set()
            killer.join(15)
            ids[1] = [r["id"] for r in farm.client.list() if r["id"] not in ids.values()][0]
            for seed, rid in ids.items():
                render = farm.client.get(rid)
                assert render["state"] == "done", (seed, render.get("error"))
                assert_same_outputs(render["tasks"], rid, refs[seed][1])
                assert_same_video(farm.client.fetch_output(rid, tmp_path / f"{rid}.mp4"), refs[seed][0])
    finally:
        redis.stop()
    print(f"redis killed during {killer.hit}; submit --wait exit {cli.returncode}")
    assert killer.hit == list(PHASES)
    assert cli.returncode == 0, err[-2000:]
    assert_same_video(tmp_path / "wait.mp4", refs[1][0])
    warnings = [r.getMessage() for r in caplog.records if "retrying until it is back" in r.getMessage()]
    loops = [m.split(":")[0] for m in warnings]
    print("outage lines:", *sorted(set(warnings)), sep="\n  ")
    for loop in ("lease expiry", "reducer"):
        assert loops.count(loop) <= len(PHASES), f"{loop} logged {loops.count(loop)} outage lines for 4 outages"
