"""Sequence-parallel stage 1 as a gang lease on a real farm: k workers at once, the group
handed out by the coordinator, the ranks in child processes under a watchdog; every render equals
`farm render --local` bit for bit, whatever happened to the gang."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from farm_cli.local import render_local
from tests.farm.chaos import assert_same_outputs
from tests.farm.farm_harness import ROOT, farm, wait_done, wait_until
from tests.farm.user_loras import write_user_loras

BASE = {
    "prompt": "a fox",
    "height": 256,
    "width": 384,
    "frames": 25,
    "frame_rate": 24.0,
    "seed": 3,
    "pack": "tiny",
    "stage2_tiles": "2x2",
    "tile_overlap": 5,
    "decode_tiles": "32,256,256",
}


@pytest.fixture(scope="module")
def reference(local_runner, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sp-local")
    _, outputs, _ = render_local({**BASE, "stage1_parallel": "1"}, folder / "local.mp4", local_runner)
    return outputs


def _gang_port(seq: int, rank0: int) -> int:
    """The port gang.lua hands rank `rank0` (0-based) of gang `seq`, from the script's own constants."""
    text = (ROOT / "coordinator/state/lua/gang.lua").read_text()
    most, base, span = map(
        int, re.search(r"GANG_MAX, GANG_PORT_BASE, GANG_PORT_SPAN = (\d+), (\d+), (\d+)", text).groups()
    )
    return base + (seq * most + rank0) % span


def _stage1(render: dict) -> dict:
    return next(t for t in render["tasks"] if t["kind"] == "denoise_stage1")


def _events(client, render_id: str) -> list[dict]:
    return list(client.watch(render_id, timeout=5))


@pytest.mark.timeout(240)
def test_gang_of_two_and_three_equals_local(store, tmp_data, tiny_packs, reference, local_runner):
    with farm(store, tmp_data, tiny_packs, workers=3) as (client, _procs):
        wait_until(lambda: len(client.workers()) == 3, 60, "3 workers registered")
        for asked, degree in (("3", 3), ("2", 2), ("8", 3)):  # 8 > the live workers: the 3 idle ones
            render = wait_done(client, client.submit({**BASE, "stage1_parallel": asked}))
            assert_same_outputs(render["tasks"], render["id"], reference)
            s1 = _stage1(render)
            started = [e for e in _events(client, render["id"]) if e.get("type") == "gang_started"]
            print(asked, s1["metrics"].get("stage1_parallel"), s1["metrics"].get("seconds"), started)
            assert s1["metrics"]["stage1_parallel"] == degree, s1["metrics"].get("gang_broke")
            assert started and started[0]["degree"] == degree
            # every rank in the record: the task, its done event and the schedule (a bar per rank)
            assert s1["ranks"] == started[0]["members"] and len(set(s1["ranks"])) == degree, s1.get("ranks")
            done = [e for e in _events(client, render["id"]) if e.get("type") == "task_done" and e["task"] == s1["id"]]
            assert done[0]["workers"] == s1["ranks"], done
            bars = [r["worker"] for r in store.render_attempts(render["id"]) if r["task"] == s1["id"]]
            assert sorted(bars) == sorted(s1["ranks"]), bars
        # a user LoRA: the worker fetches its blob and hands its rank process the file
        lora = write_user_loras(tmp_data / "loras", tiny_packs / "tiny")[0]
        sha = client.put_blob(lora.read_bytes())
        spec = {**BASE, "stage1_parallel": "2", "loras": [{"blob": sha, "name": lora.name, "strength": 0.8}]}
        render = wait_done(client, client.submit(spec))
        local_runner.loras.known[sha] = lora
        _, outputs, _ = render_local(spec, tmp_data / "lora-local.mp4", local_runner)
        assert_same_outputs(render["tasks"], render["id"], outputs)
        assert _stage1(render)["metrics"]["stage1_parallel"] == 2


def _ranks(workers: dict) -> dict[int, tuple[int, Path]]:
    """rank -> (pid, folder) of the gang rank processes the farm's workers run now."""
    parents = {p.pid for p in workers.values()}
    out = {}
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"worker.gang_rank" in argv and ppid in parents:
            folder = Path(argv[argv.index(b"worker.gang_rank") + 1].decode())
            try:
                out[json.loads((folder / "task.json").read_text())["rank"]] = (int(proc.name), folder)
            except (OSError, ValueError, KeyError):
                continue
    return out


def _mid_run(workers: dict, k: int, step: int) -> dict[int, tuple[int, Path]]:
    """The k ranks once rank 0 has kept `step` (the gang is between steps, in its collectives)."""
    return wait_until(
        lambda: (r := _ranks(workers)) and len(r) == k and (r[0][1] / f"step{step}.npz").exists() and r,
        120,
        f"a gang of {k} past step {step}",
        poll=0.02,
    )


def _start_throttled(address: str, token: str, packs: Path, data: Path, n: int, throttle: float) -> dict:
    """Workers as the harness starts them, each step `throttle` times slower (time to act mid-run)."""
    from farm_cli.services import worker_command
    from tests.farm.farm_harness import ROOT, token_file

    procs = {}
    for i in range(n):
        name = f"w{i + 1}"
        cmd = worker_command(
            address, token_file(data, name, token), packs, name, data / f"cache-{name}", wait_ms=500
        )
        log = open(data / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it until it exits
        procs[name] = subprocess.Popen(
            [*cmd, "--throttle", str(throttle)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        )
    return procs


def _check(client, render_id: str, reference: dict) -> dict:
    render = wait_done(client, render_id)
    assert_same_outputs(render["tasks"], render["id"], reference)
    return _stage1(render)["metrics"]


@pytest.mark.timeout(300)
def test_frozen_killed_and_unformed_gangs_finish_as_local(store, tmp_data, tiny_packs, reference):
    """A peer SIGSTOPped mid-step, a peer kill -9 mid-collective, a group whose port is taken: each time
    the holder ends the gang (no rank left in a collective) and stage 1 goes on from its last kept step."""
    import socket

    store.set_policy(gang_step_floor_s="3", gang_open_s="8")
    with farm(store, tmp_data, tiny_packs, workers=0) as (client, procs):
        from coordinator.api.auth import load_or_create_token

        address = client.endpoints.addresses[0]
        procs.update(_start_throttled(address, load_or_create_token(tmp_data), tiny_packs, tmp_data, 3, 2.0))
        wait_until(lambda: len(client.workers()) == 3, 60, "3 workers registered")
        # frozen: rank 1 stopped between steps; rank 0 waits out one step deadline, then goes on alone
        render_id = client.submit({**BASE, "stage1_parallel": "2"})
        ranks = _mid_run(procs, 2, 2)
        os.kill(ranks[1][0], signal.SIGSTOP)
        metrics = _check(client, render_id, reference)
        assert "deadline" in metrics["gang_broke"] and metrics["gang_resumed_at"] >= 2, metrics
        wait_until(lambda: not _ranks(procs), 30, "no gang rank left running")
        # killed: rank 2 of 3 kill -9 in the middle of the run
        render_id = client.submit({**BASE, "stage1_parallel": "3"})
        ranks = _mid_run(procs, 3, 1)
        os.kill(ranks[2][0], signal.SIGKILL)
        metrics = _check(client, render_id, reference)
        assert metrics["stage1_parallel"] == 1 and metrics["gang_resumed_at"] >= 1, metrics
        wait_until(lambda: not _ranks(procs), 30, "no gang rank left running")
        # cannot form: rank 1's port is taken (a firewall / a host that refuses) -> one worker, one log line
        seq = int(store.client.get(store.key("gangseq")) or 0) + 1
        blocker = socket.socket()
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", _gang_port(seq, 1)))
        blocker.listen(1)
        try:
            render_id = client.submit({**BASE, "stage1_parallel": "2"})
            metrics = _check(client, render_id, reference)
        finally:
            blocker.close()
        assert metrics["gang_resumed_at"] == 0 and metrics["stage1_parallel"] == 1, metrics
        lines = [
            line
            for f in tmp_data.glob("w*.log")
            for line in f.read_text().splitlines()
            if f"sp group of 2 for {render_id}" in line and "broke" in line
        ]
        assert len(lines) == 1, lines


@pytest.mark.timeout(240)
def test_coordinator_restarted_mid_gang(store, redis_url, tmp_data, tiny_packs, reference):
    """kill -9 the coordinator while a gang of 2 runs and start it again on its port: the ranks never
    needed it (peer to peer), rank 0 commits to the new one under the same fence."""
    from coordinator.api.auth import load_or_create_token
    from farm_cli.client import FarmClient
    from farm_cli.supervise import stop_processes
    from tests.farm.test_failover import free_port, serving_after, start_coordinator

    token, port = load_or_create_token(tmp_data), free_port()
    address = f"127.0.0.1:{port}"
    coordinator = start_coordinator(redis_url, tmp_data, port, "coord-1")
    procs: dict = {}
    try:
        serving_after(address, token, time.monotonic())
        procs = _start_throttled(address, token, tiny_packs, tmp_data, 2, 2.0)
        with FarmClient(address, token, timeout=30) as client:
            wait_until(lambda: len(client.workers()) == 2, 60, "2 workers registered")
            render_id = client.submit({**BASE, "stage1_parallel": "2"})
            _mid_run(procs, 2, 1)
            os.kill(coordinator.pid, signal.SIGKILL)
            coordinator.wait()
            coordinator = start_coordinator(redis_url, tmp_data, port, "coord-2")
            serving_after(address, token, time.monotonic(), timeout=60)
            render = wait_done(client, render_id)
        assert_same_outputs(render["tasks"], render["id"], reference)
        assert _stage1(render)["metrics"]["stage1_parallel"] == 2  # the gang rode through it
    finally:
        stop_processes([coordinator, *procs.values()])
