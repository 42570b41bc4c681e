"""Faults that are not a sick worker's, on one real farm (the coordinator here, worker processes, the
real CLI): an error every worker would hit fails the render once and blames nobody, and a gang whose
holder's connection breaks is taken back at once, not when its lease runs out.

- A LoRA whose data is cut short (its header intact, so the submit accepts it) is the task's own
  fault: the worker raises a permanent error, the render fails on that first attempt with the one
  line, nobody is blocklisted, and `farm retry` says why it would fail again (`farm rerun` still runs).
- A pack damaged the same way on two workers (a bad converter copied to both): the same error text
  from the second worker fails the render at once, nobody blocklisted.
- A gang of 2 (`stage1_parallel` 2): its lease records rank 0's own session, and kill -9 of rank 0's
  worker takes stage 1 back through the lost connection (task_lost); the lease here is 10 minutes,
  so an expiry could not be what took it back. Kill -9 of rank 1's worker: the holder goes on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from tests.farm.chaos import CHAOS_SPEC, ChaosFarm
from tests.farm.farm_harness import ROOT, wait_done, wait_until
from tests.farm.test_blocklist_farm import damaged_copy
from tests.farm.user_loras import write_user_loras

LEASE_MS = 600_000  # far past every wait here: a take-back seen is never an expiry
GANG_SPEC = {"prompt": "a fox", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 3,
             "pack": "tiny", "stage2_tiles": "2x2", "tile_overlap": 5, "decode_tiles": "32,256,256",
             "stage1_parallel": "2"}


@pytest.fixture(scope="module")
def faults_farm(redis_server, tmp_path_factory, tiny_packs):
    """One farm for the module: 2 healthy workers (w1, w2) that a test may kill and start again."""
    redis = connect(redis_server.url)
    redis.flushdb()
    store = FarmStore(redis)
    data = tmp_path_factory.mktemp("faults-farm")
    with ChaosFarm(store, data, tiny_packs, workers=2, lease_ms=LEASE_MS) as chaos:
        wait_until(lambda: {w["id"] for w in store.list_workers() if w.get("session")} == {"w1", "w2"}, 60,
                   "w1 and w2 registered")
        yield chaos
    redis.close()


def _cli(chaos: ChaosFarm, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", *args,
                           "--coordinator", chaos.address], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "FARM_TOKEN": chaos.token, "PYTHONPATH": str(ROOT)})


def _failed(chaos: ChaosFarm, render_id: str) -> dict:
    render = wait_until(lambda: (r := chaos.store.get_render(render_id)) and r["state"] in ("failed", "done") and r,
                        240, f"{render_id} ended")
    return {**render, "tasks": chaos.store.render_tasks(render_id)}


def _blamed(chaos: ChaosFarm, render_id: str) -> list[dict]:
    return [e for _, e in chaos.store.read_events(render_id, count=10_000) if e["type"] == "worker_blocklisted"]


@pytest.mark.timeout(300)
def test_a_lora_cut_short_fails_the_render_on_its_first_attempt_and_retry_says_why(faults_farm, tiny_packs,
                                                                                    tmp_path):
    lora = write_user_loras(tmp_path, tiny_packs / "tiny")[0]
    raw = lora.read_bytes()
    lora.write_bytes(raw[: len(raw) - 64])  # the header whole, the last tensor's data cut short
    args = ["-p", "a fox", "-H", "128", "-W", "256", "-f", "9", "--seed", "5", "--pack", "tiny"]
    submitted = _cli(faults_farm, "submit", *args, "--lora", str(lora), "0.8")
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    render_id = submitted.stdout.strip().splitlines()[-1]
    render = _failed(faults_farm, render_id)
    failed = [t for t in render["tasks"] if t["failures"]]
    print(render["error"])
    assert render["state"] == "failed" and "cut short" in render["error"] and "\n" not in render["error"]
    assert [t["failures"] for t in failed] == [1], failed  # the first attempt, on one worker
    assert render["blocklist"] == [] and not _blamed(faults_farm, render_id)
    retried = _cli(faults_farm, "retry", render_id)
    print(retried.stderr)
    assert retried.returncode == 1 and len(retried.stderr.strip().splitlines()) == 1
    assert "every worker would hit" in retried.stderr and "cut short" in retried.stderr
    assert faults_farm.store.get_render(render_id)["state"] == "failed"  # nothing ran again
    rerun = _cli(faults_farm, "rerun", render_id, "--seed", "6")  # another spec is queued as asked
    assert rerun.returncode == 0 and rerun.stdout.strip() != render_id, rerun.stderr
    _failed(faults_farm, rerun.stdout.strip())


@pytest.mark.timeout(300)
def test_the_same_error_on_two_workers_fails_the_render_and_blames_neither(faults_farm, tiny_packs, tmp_path):
    bad = damaged_copy(tiny_packs, tmp_path / "bad-packs")
    for w in ("w1", "w2"):  # only the two with the damaged copy are left
        faults_farm.kill(w)
    for w in ("bad1", "bad2"):
        faults_farm.names.append(w)
        faults_farm.start(w, packs=bad)
    try:
        wait_until(lambda: {w["id"] for w in faults_farm.store.list_workers() if w.get("state") == "idle"}
                   >= {"bad1", "bad2"}, 60, "bad1 and bad2 idle")
        render_id = faults_farm.client.submit({**CHAOS_SPEC, "seed": 7})
        render = _failed(faults_farm, render_id)
    finally:
        for w in ("bad1", "bad2"):
            faults_farm.kill(w)
            faults_farm.names.remove(w)
        for w in ("w1", "w2"):
            faults_farm.start(w)
    print(render["error"])
    assert render["state"] == "failed" and render["error"].startswith("the same error on bad")
    assert render["blocklist"] == [] and not _blamed(faults_farm, render_id)
    failed = next(t for t in render["tasks"] if t["failures"])
    assert sorted(failed["failed_on"]) == ["bad1", "bad2"]


def _gang_running(chaos: ChaosFarm, render_id: str) -> dict:
    """Stage 1's task record once its gang has started (the lease is rank 0's, both ranks handed)."""
    def started() -> dict | None:
        t = next((t for t in chaos.store.render_tasks(render_id) if t["kind"] == "denoise_stage1"), None)
        gang = chaos.store.client.hgetall(chaos.store.key("gang", t["id"])) if t else {}
        return t if t and t["state"] == "leased" and gang.get("phase") == "started" and \
            len(gang.get("handed", "").split()) >= 1 else None
    return wait_until(started, 120, f"{render_id}'s gang started", poll=0.02)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("killed", [0, 1])
def test_a_gang_rank_killed_is_taken_back_at_connection_loss(faults_farm, killed):
    chaos, store = faults_farm, faults_farm.store
    wait_until(lambda: {w["id"] for w in store.list_workers() if w.get("state") == "idle"} >= {"w1", "w2"}, 60,
               "w1 and w2 idle")
    render_id = chaos.client.submit({**GANG_SPEC, "seed": 3 + killed})
    stage1 = _gang_running(chaos, render_id)
    members = store.client.hget(store.key("gang", stage1["id"]), "members").split()
    sessions = {w["id"]: w["session"] for w in store.list_workers()}
    assert stage1["worker"] == members[0] and stage1["session"] == sessions[members[0]]  # rank 0's own
    victim = members[killed]
    start = time.monotonic()
    chaos.kill(victim)
    if killed == 0:
        back = wait_until(lambda: (t := store.get_task(stage1["id"]))["fence"] != stage1["fence"] and t, 120,
                          "stage 1 taken back")
        print(f"rank 0 killed: stage 1 back in {time.monotonic() - start:.2f} s ({back['state']})")
        ends = [e for _, e in store.read_events(render_id, count=10_000) if e.get("task") == stage1["id"]
                and e["type"] in ("task_lost", "task_expired")]
        assert [e["type"] for e in ends][:1] == ["task_lost"] and ends[0]["worker"] == victim, ends
    chaos.start(victim)
    render = wait_done(chaos.client, render_id, 400)
    ends = [e["type"] for _, e in store.read_events(render_id, count=10_000) if e["type"] == "task_expired"]
    assert render["state"] == "done" and not ends
