"""A fleet of different Macs over the real gRPC contract: a worker of another project version is refused
with one line (in its log and in `farm workers`), a step's tiles stay within the determinism class that
started it (unless the render says --any-class), and each task output records what produced it."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from coordinator.api.auth import auth_metadata
from coordinator.assemble.render_meta import provenance
from coordinator.scheduler import Scheduler
from coordinator.server import serve, stop
from farm_cli.client import FarmClient
from farm_cli.manage import print_logs
from farm_cli.views import worker_rows
from protos import farm_pb2, farm_pb2_grpc, installed
from protos.auth import farm_channel
from tests.farm.farm_harness import join_token
from worker.agent import Agent

pytestmark = pytest.mark.timeout(120)
TOKEN = "test-token-mixed"
CAP = "test-cap"
MAC = {"project_version": installed.project_version(), "chip": "Apple M2 Pro", "backend": "metal",
       "mlx_version": "0.29.1", "installed": {"lock": "1ock", "installed": "5e7"}, "fingerprint": "A"}
OLD = {**MAC, "project_version": "0.0.1"}


@pytest.fixture
def farm(store, tmp_data: Path) -> Iterator[tuple[str, object, str, farm_pb2_grpc.FarmWorkerStub]]:
    server, port = serve(store, tmp_data, token=TOKEN, lease_ms=30_000, expiry_interval_s=0.1)
    address, token = f"127.0.0.1:{port}", join_token(tmp_data, TOKEN)
    with farm_channel(address, token) as channel:
        yield address, store, token, farm_pb2_grpc.FarmWorkerStub(channel)
    stop(server, grace=0)


def _register(stub, worker_id: str, info: dict) -> farm_pb2.RegisterReply:
    request = farm_pb2.WorkerInfo(worker_id=worker_id, capabilities_json=json.dumps(info), session=worker_id)
    return stub.Register(request, timeout=10, metadata=auth_metadata(TOKEN))


def _lease(stub, worker_id: str, wait_ms: int = 300) -> farm_pb2.LeaseReply:
    request = farm_pb2.LeaseRequest(worker_id=worker_id, capabilities=[CAP], wait_ms=wait_ms)
    return stub.Lease(request, timeout=wait_ms / 1000 + 10, metadata=auth_metadata(TOKEN))


def _tiles(rid: str, n: int) -> list[dict]:
    """The tiles of one stage-2 step, as the planner names them (`<render>.stage2.s<step>.t<tile>`)."""
    return [{"id": f"{rid}.stage2.s0.t{i}", "kind": "transformer_forward", "capability": CAP,
             "params": {"step": 0, "tile_index": i, "expect": {}}, "inputs": {}} for i in range(n)]


def test_another_project_version_is_refused_with_one_line(farm) -> None:
    address, store, token, stub = farm
    store.create_render("r", {}, _tiles("r", 1))
    with pytest.raises(grpc.RpcError) as refused:
        _register(stub, "old", OLD)
    line = refused.value.details()
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "\n" not in line and "runs ltx-farm 0.0.1" in line and installed.UPGRADE_COMMAND in line
    assert not _lease(stub, "old").has_task  # a refused worker is leased nothing
    with FarmClient(address, token, timeout=10) as client:
        rows = client.workers()
    assert [(r["id"], r["state"], r["refused"]) for r in rows] == [("old", "refused", line)]
    assert worker_rows(rows)[1].endswith(line)  # `farm workers` says why, with the upgrade command
    _register(stub, "old", MAC)  # upgraded: accepted, and served
    assert _lease(stub, "old").task_id == "r.stage2.s0.t0"


class OldMac:
    """The runner side of a Mac on another ltx-farm version: what its agent registers."""

    def capabilities(self) -> dict:
        return dict(OLD)


def test_a_refused_agent_logs_the_line_and_exits(farm, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    address, _store, token, _stub = farm
    agent = Agent(address, token, OldMac(), worker_id="old", cache_dir=tmp_path / "cache", wait_ms=300)
    with caplog.at_level(logging.INFO, logger="farm.worker"):
        assert agent.run() == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and "runs ltx-farm 0.0.1" in errors[0] and installed.UPGRADE_COMMAND in errors[0]


def test_a_steps_tiles_stay_in_the_class_that_started_it(farm) -> None:
    _address, store, _token, stub = farm
    for wid, fingerprint in (("a1", "A"), ("a2", "A"), ("b1", "B")):
        _register(stub, wid, {**MAC, "fingerprint": fingerprint})
    store.create_render("r", {}, _tiles("r", 2))
    assert _lease(stub, "a1").task_id == "r.stage2.s0.t0"  # class A starts the step
    assert not _lease(stub, "b1").has_task  # another class: not dealt a tile of A's step
    assert _lease(stub, "a2").task_id == "r.stage2.s0.t1"

    store.create_render("m", {"any_class": True}, _tiles("m", 2))  # --any-class lifts it
    assert _lease(stub, "b1").task_id == "m.stage2.s0.t0"
    assert _lease(stub, "a1").task_id == "m.stage2.s0.t1"

    store.create_render("q", {}, _tiles("q", 2))
    assert _lease(stub, "a1").task_id == "q.stage2.s0.t0"
    assert not _lease(stub, "b1").has_task
    for wid in ("a1", "a2"):  # class A is gone: its steps go on with B rather than wait forever
        store.lose_leases(wid, wid, "test: the Mac went away")
    assert _lease(stub, "b1").task_id.split(".")[0] in ("r", "q")


def test_each_output_records_what_produced_it(farm, tmp_data: Path, capsys: pytest.CaptureFixture) -> None:
    address, store, token, stub = farm
    _register(stub, "a1", MAC)
    store.create_render("r", {}, _tiles("r", 2))
    lease = _lease(stub, "a1")
    done = farm_pb2.CompleteRequest(task_id=lease.task_id, worker_id="a1", fence=lease.fence)
    assert stub.Complete(done, timeout=10, metadata=auth_metadata(TOKEN)).status == farm_pb2.OK
    made = {"worker": "a1", **{k: MAC[k] for k in ("chip", "backend", "project_version", "mlx_version",
                                                   "fingerprint", "installed")}}
    assert store.get_task(lease.task_id)["made_by"] == made
    _outputs, runs = Scheduler(store, None, tmp_data).task_outputs("r")
    meta = provenance(runs)  # what render.json carries
    assert meta["tasks"] == {"stage2.s0.t0": made} and meta["classes"] == ["A"]
    with FarmClient(address, token, timeout=10) as client:
        print_logs(client.get("r"), None)  # `farm logs`
    assert "made by: Apple M2 Pro (metal), ltx-farm" in capsys.readouterr().out


def test_any_class_travels_from_submit_to_the_lease_script(farm) -> None:
    address, store, token, _stub = farm
    with FarmClient(address, token, timeout=10) as client:
        mixed = client.submit({"prompt": "a cat", "pack": "tiny", "any_class": True})
        plain = client.submit({"prompt": "a cat", "pack": "tiny"})
        assert client.get(mixed)["spec"]["any_class"] is True
        for rid in (mixed, plain):
            client.cancel(rid)
    assert store.client.hget(store.key("render", mixed), "any_class") == "1"  # what lease.lua reads
    assert store.client.hget(store.key("render", plain), "any_class") is None
