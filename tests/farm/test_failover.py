"""Coordinator outages under a real render (real Redis, coordinator and worker processes, the CLI's
`farm submit --wait`): a standby takes over a killed leader within 10 s, and a lone coordinator killed
and started again; either way every worker and the waiting client follow by themselves, the client
exits 0 with the mp4, and the render equals `farm render --local` bit for bit."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import av
import grpc
import numpy as np
import pytest

from coordinator.api.auth import load_or_create_token
from coordinator.state.store import FarmStore, NotLeader
from farm_cli.client import FarmClient, FarmError
from farm_cli.local import render_local
from farm_cli.remote import latents_from_outputs
from farm_cli.render_options import spec_of_args
from farm_cli.supervise import stop_processes
from protos import farm_pb2, farm_pb2_grpc
from protos.auth import farm_channel
from protos.endpoints import leader_hint
from protos.tensors import decode_tensor
from tests.farm.farm_harness import ROOT, assert_identical, start_worker

CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]
# Tiled stage 2 (2x2: tile tasks on workers, blend + step tasks on the coordinator) and a tiled decode.
ARGS = ["-p", "a fox", "-H", "256", "-W", "384", "-f", "25", "--seed", "3", "--pack", "tiny",
        "--stage2-tiles", "2x2", "--tile-overlap", "5", "--decode-tiles", "32,256,256"]


def cli_spec() -> dict:
    """The spec `farm submit ARGS` sends, parsed by submit's own options."""
    return spec_of_args(ARGS).to_dict()


@pytest.fixture(scope="module")
def reference(tiny_packs, local_runner, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "ref.mp4"
    path, outputs, blobs = render_local(cli_spec(), out, local_runner)
    return path, latents_from_outputs(outputs, "local", blobs.get)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_coordinator(redis_url: str, data: Path, port: int, name: str) -> subprocess.Popen:
    cmd = [*CLI, "coordinator", "--redis-url", redis_url, "--data", str(data), "--port", str(port),
           "--dashboard-port", "0"]
    with open(data / f"{name}.log", "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})


def serving_after(address: str, token: str, start: float, timeout: float = 30) -> float:
    """Seconds from `start` until the coordinator at `address` answers a farm RPC."""
    with FarmClient(address, token, timeout=2) as farm:
        while time.monotonic() - start < timeout:
            try:
                farm.list(1)
                return time.monotonic() - start
            except FarmError:
                time.sleep(0.1)
    raise AssertionError(f"{address} did not serve within {timeout} s")


def submit_wait(addresses: str, token: str, out: Path) -> subprocess.Popen:
    cmd = [*CLI, "submit", *ARGS, "--wait", "-o", str(out), "--coordinator", addresses]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "FARM_TOKEN": token})


def wait_for_lease(store, suffix: str, timeout: float = 120) -> str:
    """The render id once its task `*{suffix}` is leased (the moment to pull the plug)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for render in store.list_renders(5):
            for task in store.render_tasks(render["id"]):
                if task["id"].endswith(suffix) and task["state"] in ("leased", "done"):
                    return render["id"]
        time.sleep(0.05)
    raise AssertionError(f"no {suffix} lease within {timeout} s")


def mp4_frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def check_client_and_result(client: subprocess.Popen, out: Path, address: str, token: str, reference) -> str:
    """The waiting client exited 0 with the mp4, said one line about the outage, and the result (mp4
    frames, every stage latent) is bit-identical to the local reference. Returns the client's stdout."""
    try:
        stdout, err = client.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        client.kill()
        raise
    assert client.returncode == 0, err[-3000:]
    assert err.count("lost the coordinator") == 1, err[-3000:]
    local_mp4, local_arrays = reference
    assert all((a == b).all() for a, b in zip(mp4_frames(out), mp4_frames(local_mp4), strict=True))
    with FarmClient(address, token, timeout=30) as farm:
        render = farm.get(farm.list(1)[0]["id"])
        outputs = {t["id"]: t.get("outputs") or {} for t in render["tasks"]}
        latents = latents_from_outputs(outputs, render["id"], lambda sha: decode_tensor(farm.get_blob(sha)))
        assert len(latents) == 4
        assert_identical(latents, local_arrays)
    return stdout


stop_all = stop_processes  # the tests below and test_takeover_clients / test_sentinel stop theirs so


@pytest.mark.timeout(420)
def test_standby_takes_over_a_killed_leader_and_everyone_follows(store, redis_url, tmp_data, tiny_packs,
                                                                  reference, tmp_path):
    token = load_or_create_token(tmp_data)  # one data folder for both: token and blobs are shared
    ports = free_port(), free_port()
    leader, standby = (f"127.0.0.1:{p}" for p in ports)
    procs = [start_coordinator(redis_url, tmp_data, ports[0], "coord-a")]
    try:
        serving_after(leader, token, time.monotonic())
        procs.append(start_coordinator(redis_url, tmp_data, ports[1], "coord-b"))
        both = f"{leader},{standby}"
        procs += [start_worker(both, token, tiny_packs, f"w{i}", tmp_data) for i in (1, 2)]
        out = tmp_path / "out.mp4"
        client = submit_wait(both, token, out)
        procs.append(client)
        render_id = wait_for_lease(store, ".stage2.s0.t0")  # tiles in flight, the coordinator's step next
        before = store.leader()
        assert before["address"] == leader
        os.kill(procs[0].pid, signal.SIGKILL)
        serving_after(standby, token, time.monotonic(), timeout=120)  # how soon: `farm bench standby`
        lead = store.leader()
        # The standby serves because it took the lapsed leadership lease: one takeover (the epoch one up,
        # fencing the dead leader's writes), claimed only once the dead leader's lease had run out.
        assert lead["address"] == standby and int(lead["epoch"]) == int(before["epoch"]) + 1, (before, lead)
        assert int(lead["since_ms"]) >= int(before["deadline_ms"]), (before, lead)
        check_client_and_result(client, out, standby, token, reference)
        tasks = store.render_tasks(render_id)
        after = [t for t in tasks if int(t["done_ms"]) > int(store.leader()["since_ms"])]
        assert {t["worker"] for t in after} & {"w1", "w2"}, "no worker followed the new leader"
        assert all(t["state"] == "done" for t in tasks)
    finally:
        stop_all(procs)


@pytest.mark.timeout(420)
def test_wait_and_watch_clients_ride_through_a_coordinator_restart(store, redis_url, tmp_data, tiny_packs, reference,
                                                         tmp_path):
    token = load_or_create_token(tmp_data)
    port = free_port()
    address = f"127.0.0.1:{port}"
    procs = [start_coordinator(redis_url, tmp_data, port, "coord-1")]
    try:
        serving_after(address, token, time.monotonic())
        procs += [start_worker(address, token, tiny_packs, f"w{i}", tmp_data) for i in (1, 2)]
        out = tmp_path / "out.mp4"
        client = submit_wait(address, token, out)
        procs.append(client)
        render_id = wait_for_lease(store, ".stage1")
        watcher = subprocess.Popen([*CLI, "watch", render_id, "--coordinator", address],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                   env={**os.environ, "PYTHONPATH": str(ROOT), "FARM_TOKEN": token})
        procs.append(watcher)
        wait_for_lease(store, ".stage2.s1.t0")
        os.kill(procs[0].pid, signal.SIGKILL)
        time.sleep(1.0)
        procs[0] = start_coordinator(redis_url, tmp_data, port, "coord-2")  # waits out the dead one's lease
        stdout = check_client_and_result(client, out, address, token, reference)
        assert f"wrote {out}" in stdout
        watched, err = watcher.communicate(timeout=60)  # `farm watch` rode through it too
        assert watcher.returncode == 0 and f"{render_id} done" in watched, err[-2000:]
        assert err.count("lost the coordinator") == 1, err[-2000:]
    finally:
        stop_all(procs)


@pytest.mark.timeout(120)
def test_a_paused_leader_wakes_up_as_a_standby_and_its_writes_are_refused(store, redis_url, tmp_data):
    """SIGSTOP the leader past its lease: the standby takes over with a new epoch; the old leader, let
    run again, answers UNAVAILABLE naming the new leader, and a write under its old epoch is refused."""
    token = load_or_create_token(tmp_data)
    ports = free_port(), free_port()
    first, second = (f"127.0.0.1:{p}" for p in ports)
    procs = [start_coordinator(redis_url, tmp_data, ports[0], "coord-a")]
    try:
        serving_after(first, token, time.monotonic())
        procs.append(start_coordinator(redis_url, tmp_data, ports[1], "coord-b"))
        old_epoch = store.leader()["epoch"]
        os.kill(procs[0].pid, signal.SIGSTOP)
        serving_after(second, token, time.monotonic())
        assert store.leader()["address"] == second and store.leader()["epoch"] != old_epoch
        os.kill(procs[0].pid, signal.SIGCONT)
        time.sleep(2)  # its next claims find the new holder
        with farm_channel(first, token) as channel, pytest.raises(grpc.RpcError) as refused:
            farm_pb2_grpc.FarmClientStub(channel).ListRenders(
                farm_pb2.ListRendersRequest(), timeout=5, metadata=(("authorization", f"Bearer {token}"),))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert leader_hint(refused.value.details()) == second, refused.value.details()
        stale = FarmStore(store.client)
        stale.epoch = old_epoch  # what the old leader's loops still send
        with pytest.raises(NotLeader):
            stale.register_worker("w1", {})
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        stop_all(procs)


@pytest.mark.timeout(30)
def test_the_port_of_a_killed_coordinator_is_free_for_its_restart_but_a_live_one_is_not():
    """kill -9 leaves the dead server's connections in TIME_WAIT for a minute: `farm coordinator`'s port
    check must let the restart bind (as gRPC itself can), yet still refuse a port someone listens on."""
    from farm_cli.services import _port_free

    server = subprocess.Popen([sys.executable, "-c", "import socket, time\n"
                               "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                               "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True)\n"
                               "c, _ = s.accept(); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    port = int(server.stdout.readline())
    client = socket.create_connection(("127.0.0.1", port))
    try:
        assert not _port_free("127.0.0.1", port)  # listening
        time.sleep(0.2)  # accepted
        server.kill()
        server.wait(timeout=10)
        time.sleep(0.2)
        assert _port_free("127.0.0.1", port)  # only TIME_WAIT left
    finally:
        client.close()
        server.stdout.close()
