"""The farm's state on a replicated set (real primary, replicas and three sentinels on 127.0.0.1): the
sentinel URL, replica-acknowledged fate writes, a primary killed -9 (the store follows the new one, its
scripts re-load there, an acknowledged result and epoch survive, epochs only grow), and a render whose
primary dies mid-way finishing bit-identical to `farm render --local`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from coordinator.api.auth import load_or_create_token
from coordinator.state.redis_server import connect
from coordinator.state.replicated import ReplicatedRedis
from coordinator.state.sentinel import FULL_WAIT_EVERY_S, SentinelUrl, check_redis_url, parse_sentinel_url
from coordinator.state.store import EpochNotReplicated, FarmStore, NotLeader
from farm_cli.bench import standby
from farm_cli.bench.standby import PHASES, SEEDS, StandbyFarm, chaos_round
from farm_cli.doctor import check_redis
from farm_cli.local import render_local
from farm_cli.remote import latents_from_outputs
from tests.farm.chaos import assert_same_outputs, assert_same_video
from tests.farm.farm_harness import ROOT, start_worker
from tests.farm.test_failover import (
    check_client_and_result,
    free_port,
    serving_after,
    start_coordinator,
    stop_all,
    wait_for_lease,
)

CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]
TASK = {"id": "r1.t", "kind": "noop", "capability": "mlx"}


def test_sentinel_urls_parse_and_bad_ones_say_what_is_wrong():
    assert parse_sentinel_url("redis+sentinel://a:26379,b:26380/farm") == SentinelUrl(
        (("a", 26379), ("b", 26380)), "farm")
    assert parse_sentinel_url("valkey+sentinel://:s%40cret@127.0.0.1:1/m/2") == SentinelUrl(
        (("127.0.0.1", 1),), "m", 2, "s@cret")
    for bad, says in (("redis+sentinel://a:1", "master's name"), ("redis+sentinel://a/farm", "HOST:PORT"),
                      ("redis+sentinel:///farm", "no sentinel"), ("redis+sentinel://a:99999/farm", "HOST:PORT"),
                      ("redis+sentinel://a:1/farm/x", "not a number"), ("mysql://a:1/x", "redis://")):
        with pytest.raises(ValueError, match=says):
            check_redis_url(bad)
    check_redis_url("redis://127.0.0.1:6379/0")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["coordinator", "up"])
def test_a_malformed_sentinel_url_is_one_line_and_exit_2(command, tmp_path):
    run = subprocess.run([*CLI, command, "--redis-url", "redis+sentinel://host-without-port/farm",
                          "--data", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=50)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1 and "HOST:PORT" in lines[0], run.stderr[-2000:]


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    with ReplicatedRedis(tmp_path_factory.mktemp("set"), replicas=1, persistence=False) as rs:
        yield rs


@pytest.mark.timeout(60)
def test_the_store_reaches_the_set_through_sentinels_and_fate_writes_are_acknowledged(replicated):
    client = connect(replicated.url)
    client.flushall()
    store = FarmStore(client)
    assert store.wait_ms > 0
    assert store.create_render("r1", {"prompt": "x"}, [TASK])
    assert store.lease("w1", ["mlx"], 30_000)["id"] == "r1.t"
    assert store.complete("r1.t", "w1", store.get_task("r1.t")["fence"], {}, {}) == "render_ready"
    assert store.acks.unacked == 0 and not store.acks.degraded
    health = store.redis_health()
    assert health["mode"] == "sentinel" and health["primary"] == f"127.0.0.1:{replicated.primary().port}"
    assert health["replicas_online"] == 1 and health["sentinels_seeing"] == 3, health
    assert "replicas 1/1 online" in health["line"]
    client.close()


def test_one_unreplicated_server_sends_no_wait(store):
    """A plain URL: no WAIT after any script, the behaviour and speed of before."""
    assert store.wait_ms == 0
    store.client.config_resetstat()
    assert store.create_render("r1", {}, [TASK]) and store.lease("w1", ["mlx"], 30_000)
    assert "cmdstat_wait" not in store.client.info("commandstats")
    assert store.redis_health()["mode"] == "single"


def _until(fn, timeout: float = 30.0):
    """fn() once it stops raising a Redis connection error (a failover in progress)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _kill_primary(rs: ReplicatedRedis) -> float:
    primary = rs.primary()
    assert primary is not None and primary.proc is not None
    primary.proc.kill()
    primary.proc.wait(10)
    return time.monotonic()


@pytest.mark.timeout(120)
def test_a_killed_primary_loses_no_acknowledged_write_and_epochs_only_grow(tmp_path):
    with ReplicatedRedis(tmp_path / "set", replicas=2, persistence=False) as rs:
        a, b = FarmStore(connect(rs.url)), FarmStore(connect(rs.url))
        lead, epoch, _ = a.claim_leadership("A", "a:1", 1500)
        assert lead and epoch == 1
        a.epoch = str(epoch)
        a.create_render("r1", {}, [TASK, {**TASK, "id": "r1.u", "deps": ["r1.t"]}])
        fence = a.lease("w1", ["mlx"], 30_000)["fence"]
        assert a.complete("r1.t", "w1", fence, {"x": "f" * 64}, {}) == "ok"  # acknowledged: then the kill
        old = rs.primary()
        _kill_primary(rs)
        leased = _until(lambda: a.lease("w2", ["mlx"], 30_000))  # how soon: `farm bench standby`
        assert rs.primary() is not old and leased["id"] == "r1.u"  # the client followed the sentinels' promotion
        assert a.get_task("r1.t")["state"] == "done" and a.get_task("r1.t")["outputs"] == {"x": "f" * 64}
        # The new primary re-loads scripts it lacks: force it, for a fenced write and a plain one.
        a.client.script_flush()
        assert a.heartbeat("r1.u", "w2", leased["fence"], 30_000) == "ok"
        assert a.complete("r1.u", "w2", leased["fence"], {}, {}) == "render_ready"
        assert a.leader()["epoch"] == "1"  # the acknowledged epoch survived the failover
        time.sleep(1.6)  # A's lease lapses; B takes over with a bigger epoch, A's writes are refused
        lead, epoch, _ = _until(lambda: b.claim_leadership("B", "b:1", 1500))  # once a replica holds it
        assert lead and epoch == 2
        b.epoch = str(epoch)
        with pytest.raises(NotLeader):
            a.emit("r1", {"type": "late"})
        _kill_primary(rs)  # the last member is promoted, with no replica left
        c = FarmStore(connect(rs.url))
        deadline = time.monotonic() + 30
        with pytest.raises(EpochNotReplicated):  # B's lease lapsed: C's new epoch is on no replica
            while time.monotonic() < deadline:
                try:
                    c.claim_leadership("C", "c:1", 5000)
                except EpochNotReplicated:
                    raise
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                time.sleep(0.05)
        assert c.create_render("r2", {}, [{**TASK, "id": "r2.t"}])  # fate writes go on, unacknowledged
        assert c.acks.degraded and c.acks.unacked >= 1


@pytest.mark.timeout(90)
def test_a_dead_member_comes_back_as_a_replica_and_writes_are_acknowledged_again(tmp_path):
    """revive (what `farm up --redis-replicas` runs): the killed primary starts again as a replica of the
    promoted one, so the set is whole (and fate writes acknowledged) seconds after a failover."""
    with ReplicatedRedis(tmp_path / "set", replicas=1, persistence=False, revive=True) as rs:
        store = FarmStore(connect(rs.url))
        old = rs.primary()
        _kill_primary(rs)
        assert _until(lambda: store.create_render("r1", {}, [TASK]))  # on the promoted replica, alone
        deadline = time.monotonic() + 30
        while store.redis_health().get("replicas_online") != 1:
            assert time.monotonic() < deadline, store.redis_health()
            time.sleep(0.1)
        assert rs.primary() is not old and old.proc.poll() is None
        # While degraded a write's WAIT is a 10 ms probe, with a whole wait every 5 s: a replica that has
        # just synced on a loaded machine may miss a probe, so writes are acknowledged within one whole wait.
        deadline = time.monotonic() + 3 * FULL_WAIT_EVERY_S
        for n in range(1000):
            assert store.create_render(f"r2.{n}", {}, [{**TASK, "id": f"r2.{n}.t"}])
            if not store.acks.degraded:
                break
            assert time.monotonic() < deadline, "writes unacknowledged a whole wait after the replica is online"
            time.sleep(0.2)


BENCH_ARGS = standby.client_args


def short_args(seed: int) -> list[str]:
    """The bench's `farm submit` flags at 9 frames, not 25: the plan has the same tasks (stage-2 tiles, the
    reducer steps, both decode tiles, the audio), each phase the round kills in comes round, in less compute."""
    args = BENCH_ARGS(seed)
    return [*args[:args.index("-f") + 1], "9", *args[args.index("-f") + 2:]]


@pytest.fixture(scope="module")
def short_round():
    """The bench's round on short renders: its client, its renders alongside and their references."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(standby, "client_args", short_args)
        yield


@pytest.fixture(scope="module")
def standby_refs(short_round, local_runner, tmp_path_factory):
    """`farm render --local` of the round's three renders (the `--wait` client's and two alongside)."""
    folder = tmp_path_factory.mktemp("standby-local")
    return {s: render_local(standby.client_spec(s), folder / f"local-{s}.mp4", local_runner) for s in SEEDS}


def test_the_short_round_plans_the_benchs_tasks():
    """9 frames plan the tasks 25 do (ids, kinds, inputs, where they run): the round's phases are the bench's."""
    from coordinator.plan.render import normalize_spec, plan_render
    from farm_cli.render_options import spec_of_args

    def plan(args: list[str]) -> list[tuple]:
        tasks = plan_render(normalize_spec(spec_of_args(args).to_dict()), "r")
        return [(t["id"], t["kind"], sorted(t.get("inputs") or {}), t.get("capability")) for t in tasks]

    for seed in SEEDS:
        assert plan(short_args(seed)) == plan(BENCH_ARGS(seed)) and "9" in short_args(seed)


@pytest.mark.timeout(600)
def test_the_mac_of_primary_and_leader_killed_in_every_phase_renders_finish_identical_to_local(
        short_round, standby_refs, tiny_packs, tmp_path):
    """One round of `farm bench standby`: a leader and a standby coordinator process on the set (one
    replica, dead members revived), the Redis primary and the leader kill -9ed together at stage 2, a
    reducer step, a decode tile and assembling; the `submit --wait` client given both addresses exits 0,
    nothing the store reported done before a kill is lost after it, every render equals --local."""
    data = tmp_path / "data"
    data.mkdir()
    with ReplicatedRedis(tmp_path / "set", replicas=1, revive=True) as rs, \
            StandbyFarm(rs, data, tiny_packs) as farm, chaos_round(farm, tmp_path) as result:
        assert result.client_rc == 0, result.client_err[-3000:]
        for seed, render in result.renders.items():
            assert render["state"] == "done", render.get("error")
            assert_same_outputs(render["tasks"], render["id"], standby_refs[seed][1])
            assert_same_video(result.api.fetch_output(render["id"], tmp_path / f"{seed}.mp4"), standby_refs[seed][0])
        assert_same_video(tmp_path / f"client-{SEEDS[0]}.mp4", standby_refs[SEEDS[0]][0])
        health = farm.store.redis_health()["line"]
    print(f"Mac (primary + leader) killed during {[k.phase for k in result.kills]}; kill -9 to the standby "
          f"leading: {[round(k.leader_s, 2) for k in result.kills]} s, to the next task lease: "
          f"{[w if w is None else round(w, 2) for w in result.waits]} s; {health}")
    assert [k.phase for k in result.kills] == list(PHASES)
    assert [k.lost for k in result.kills] == [[]] * len(PHASES), "an acknowledged transition was lost"


@pytest.mark.timeout(90)
def test_farm_up_with_replicas_starts_the_set_and_doctor_reads_its_health(tmp_path):
    """`farm up --redis-replicas 1`: the coordinator on the set (its sentinel URL printed), `farm doctor
    --redis-url` reports primary, replica and sentinels; at stop the primary's name is kept."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    up = subprocess.Popen([*CLI, "up", "--redis-replicas", "1", "--workers", "0", "--port", str(port),
                           "--dashboard-port", "0", "--data", str(tmp_path)], stderr=subprocess.PIPE,
                          stdout=subprocess.DEVNULL, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        url = ""
        for line in up.stderr:
            if line.startswith("redis: "):
                url = line.rsplit(" ", 1)[1].strip()
                break
        assert url.startswith("redis+sentinel://127.0.0.1:"), url
        status, line = check_redis(url)
        assert status == "ok" and "replicas 1/1 online" in line and "sentinels seeing it 3/3" in line, line
        assert check_redis("redis+sentinel://nope/farm")[0] == "fail"
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(30)
    assert up.returncode == 0
    assert (tmp_path / "redis-primary").read_text().strip() == "redis"
    assert not (tmp_path / "redis" / "redis.url").exists()  # every member stopped


@pytest.fixture(scope="module")
def reference(standby_refs):
    """`farm render --local` of the spec the `--wait` client below sends (the round's client's, seed 3, at 9
    frames): mp4 and stage latents."""
    path, outputs, blobs = standby_refs[SEEDS[0]]
    return path, latents_from_outputs(outputs, "local", blobs.get)


def submit_wait(addresses: str, token: str, out: Path) -> subprocess.Popen:
    """`farm submit --wait` of test_failover's render (tiled stage 2, tiled decode), at the round's 9 frames."""
    cmd = [*CLI, "submit", *standby.client_args(SEEDS[0]), "--wait", "-o", str(out), "--coordinator", addresses]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "FARM_TOKEN": token})


@pytest.mark.timeout(420)
def test_the_leaders_mac_lost_with_the_primary_a_standby_takes_over_on_the_replicas(
        short_round, reference, tiny_packs, tmp_path):
    """The Mac holding the leading coordinator and the Redis primary dies (both kill -9 at stage 2): the
    sentinels promote a replica, the standby takes the lease with an epoch a replica holds, workers and
    `farm submit --wait` follow, and the render equals `farm render --local` bit for bit."""
    data = tmp_path / "data"
    data.mkdir()
    token = load_or_create_token(data)
    with ReplicatedRedis(tmp_path / "set", replicas=2) as rs:
        store = FarmStore(connect(rs.url))
        ports = free_port(), free_port()
        leader, standby = (f"127.0.0.1:{p}" for p in ports)
        procs = [start_coordinator(rs.url, data, ports[0], "coord-a")]
        try:
            serving_after(leader, token, time.monotonic())
            procs.append(start_coordinator(rs.url, data, ports[1], "coord-b"))
            both = f"{leader},{standby}"
            procs += [start_worker(both, token, tiny_packs, f"w{i}", data) for i in (1, 2)]
            out = tmp_path / "out.mp4"
            client = submit_wait(both, token, out)
            procs.append(client)
            wait_for_lease(store, ".stage2.s0.t0")
            assert store.leader()["address"] == leader
            killed = _kill_primary(rs)
            os.kill(procs[0].pid, signal.SIGKILL)
            took = serving_after(standby, token, killed, timeout=60)
            print(f"leader + primary kill -9: the standby served after {took:.2f} s")
            check_client_and_result(client, out, standby, token, reference)
            assert store.leader()["address"] == standby and int(store.leader()["epoch"]) == 2
        finally:
            stop_all(procs)
