"""Sequence-parallel stage 1 as a gang lease on a real farm: k workers at once, the group
handed out by the coordinator, each rank inside its worker's process on the worker's loaded model,
under socket deadlines; every render equals `farm render --local` bit for bit, whatever happened to
the gang (a frozen or killed peer is a frozen or killed worker). Dub-It's stage 1 gangs too, its reference
tokens split with the video's."""

from __future__ import annotations

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
from tests.media_files import write_clip_with_audio, write_ic_lora

# 9 frames: the tasks of 25 (stage 1's degree table for 2, 3 and 8, stage 2's 2x2 tiles, both decode tiles) in
# less compute; stage 1's 8 steps are what the gangs are frozen, killed and cut between.
BASE = {
    "prompt": "a fox",
    "height": 256,
    "width": 384,
    "frames": 9,
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


@pytest.mark.timeout(400)
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
        # a user LoRA: each worker fetches its blob and its rank runs with it
        lora = write_user_loras(tmp_data / "loras", tiny_packs / "tiny")[0]
        sha = client.put_blob(lora.read_bytes())
        spec = {**BASE, "stage1_parallel": "2", "loras": [{"blob": sha, "name": lora.name, "strength": 0.8}]}
        render = wait_done(client, client.submit(spec))
        local_runner.loras.known[sha] = lora
        _, outputs, _ = render_local(spec, tmp_data / "lora-local.mp4", local_runner)
        assert_same_outputs(render["tasks"], render["id"], outputs)
        assert _stage1(render)["metrics"]["stage1_parallel"] == 2
        _dub_it_gang(client, tmp_data, local_runner)


def _dub_it_gang(client, tmp_data: Path, local_runner) -> None:
    """Dub-It's stage 1 as a gang of 2: its reference video tokens split with the video's, its reference audio
    whole on each rank. 3 workers: its three encodes start at once and only the stage-2 one can still run when
    stage 1 is ready, so a peer is idle for the gang."""
    talk, lora = write_clip_with_audio(tmp_data / "talk.mp4", frames=30), write_ic_lora(tmp_data / "ic.safetensors")
    files = {client.put_blob(path.read_bytes()): path for path in (talk, lora)}
    sha = {path: blob for blob, path in files.items()}
    spec = {**BASE, "height": 128, "width": 128, "frames": 9, "stage2_tiles": None, "decode_tiles": "off",
            "encode_tiles": "24,128", "stage1_parallel": "2", "dub_video": {"blob": sha[talk], "name": "talk.mp4"},
            "ic_lora": {"blob": sha[lora], "strength": 1.0, "downscale": 2, "name": "ic.safetensors"}}
    render = wait_done(client, client.submit(spec))
    local_runner.loras.known.update(files)
    _, outputs, _ = render_local(spec, tmp_data / "dub-local.mp4", local_runner, media=files)
    assert_same_outputs(render["tasks"], render["id"], outputs)
    s1 = _stage1(render)
    assert "audio_reference" in s1["inputs"] and "control_latent" in s1["inputs"]
    assert s1["metrics"]["stage1_parallel"] == 2 and len(set(s1["ranks"])) == 2, s1["metrics"].get("gang_broke")


RANK_LINE = re.compile(r"gang rank (\d+) of (\d+) for (\S+?):? (open|step \d+|left the group)")


def _ranks(workers: dict, data: Path, render_id: str) -> dict[int, tuple[int, int]]:
    """rank -> (worker pid, last step it logged) of the ranks of `render_id`'s gang still in their group,
    read from the workers' logs (each rank runs in its worker's process)."""
    out: dict[int, tuple[int, int]] = {}
    for name, proc in workers.items():
        log = data / f"{name}.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        for line in lines:
            m = RANK_LINE.search(line)
            if not m or render_id not in m[3]:
                continue
            rank = int(m[1])
            if m[4] == "left the group":
                out.pop(rank, None)
            else:
                out[rank] = (proc.pid, int(m[4].split()[1]) if m[4].startswith("step") else 0)
    return out


def _mid_run(workers: dict, data: Path, render_id: str, k: int, step: int) -> dict[int, tuple[int, int]]:
    """The k ranks once rank 0 has kept `step` (the gang is between steps, in its gathers)."""
    return wait_until(
        lambda: (r := _ranks(workers, data, render_id)) and len(r) == k and r[0][1] >= step and r,
        120,
        f"a gang of {k} past step {step}",
        poll=0.02,
    )


def _all_idle(store, n: int) -> None:
    wait_until(lambda: sum(w.get("state") == "idle" for w in store.list_workers()) >= n, 60, f"{n} workers idle")


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
        # frozen: rank 1's worker stopped between steps; rank 0 waits out one step deadline, goes on alone
        render_id = client.submit({**BASE, "stage1_parallel": "2"})
        ranks = _mid_run(procs, tmp_data, render_id, 2, 2)
        os.kill(ranks[1][0], signal.SIGSTOP)
        try:
            metrics = _check(client, render_id, reference)
        finally:
            os.kill(ranks[1][0], signal.SIGCONT)  # thawed, its rank finds the group closed and ends
        assert "deadline" in metrics["gang_broke"] and metrics["gang_resumed_at"] >= 2, metrics
        wait_until(lambda: not _ranks(procs, tmp_data, render_id), 30, "no gang rank left running")
        _all_idle(store, 3)
        # killed: rank 2 of 3's worker kill -9 in the middle of the run
        render_id = client.submit({**BASE, "stage1_parallel": "3"})
        ranks = _mid_run(procs, tmp_data, render_id, 3, 1)
        os.kill(ranks[2][0], signal.SIGKILL)
        metrics = _check(client, render_id, reference)
        assert metrics["stage1_parallel"] == 1 and metrics["gang_resumed_at"] >= 1, metrics
        survivors = {n: p for n, p in procs.items() if p.pid != ranks[2][0]}
        wait_until(lambda: not _ranks(survivors, tmp_data, render_id), 30, "no gang rank left running")
        _all_idle(store, 2)
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
            _mid_run(procs, tmp_data, render_id, 2, 1)
            os.kill(coordinator.pid, signal.SIGKILL)
            coordinator.wait()
            coordinator = start_coordinator(redis_url, tmp_data, port, "coord-2")
            serving_after(address, token, time.monotonic(), timeout=60)
            render = wait_done(client, render_id)
        assert_same_outputs(render["tasks"], render["id"], reference)
        assert _stage1(render)["metrics"]["stage1_parallel"] == 2  # the gang rode through it
    finally:
        stop_processes([coordinator, *procs.values()])
