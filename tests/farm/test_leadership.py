"""The coordinators' leadership lease and its fence, on a real Redis: one leader at a time, a lapsed
lease is taken with a new epoch, and the old leader's writes are refused from then on."""

from __future__ import annotations

import time

import grpc
import pytest

from coordinator.state.store import FarmStore, NotLeader
from protos import farm_pb2, farm_pb2_grpc
from protos.auth import farm_channel
from protos.endpoints import Endpoints, leader_hint, parse_addresses, standby_details
from tests.farm.farm_harness import join_token

TASK = {"id": "r1.a", "kind": "k", "capability": "mlx"}


def test_one_leader_renews_and_a_lapsed_lease_moves_with_a_new_epoch(redis_client):
    a, b = FarmStore(redis_client), FarmStore(redis_client)
    assert a.claim_leadership("A", "host-a:1", 300) == (True, 1, "host-a:1")
    assert b.claim_leadership("B", "host-b:1", 300) == (False, 1, "host-a:1")
    assert a.claim_leadership("A", "host-a:1", 300) == (True, 1, "host-a:1")  # a renewal keeps the epoch
    time.sleep(0.4)  # A stops renewing: the lease lapses by Redis TIME
    assert b.claim_leadership("B", "host-b:1", 300) == (True, 2, "host-b:1")
    assert a.claim_leadership("A", "host-a:1", 300) == (False, 2, "host-b:1")
    assert b.claim_leadership("B", "host-b:1", 0) == (False, 2, "")  # resign: free at once
    assert a.claim_leadership("A", "host-a:1", 300) == (True, 3, "host-a:1")


def test_the_old_leaders_writes_are_refused_once_another_leads(redis_client):
    old, new = FarmStore(redis_client), FarmStore(redis_client)
    _, epoch, _ = old.claim_leadership("A", "a:1", 200)
    old.epoch = str(epoch)
    old.create_render("r1", {}, [dict(TASK)])
    time.sleep(0.3)
    _, epoch2, _ = new.claim_leadership("B", "b:1", 5000)
    new.epoch = str(epoch2)
    with pytest.raises(NotLeader):
        old.lease("w1", ["mlx"], 1000)
    with pytest.raises(NotLeader):
        old.cancel_render("r1")
    assert new.get_render("r1")["state"] == "queued"
    assert new.lease("w1", ["mlx"], 1000)["id"] == "r1.a"


def test_an_idle_agent_registering_gives_back_a_lease_whose_reply_it_never_got(store):
    """A coordinator that dies between granting a lease and sending the reply strands the task until its
    deadline, unless the agent, registering again with no task in hand, says so."""
    store.register_worker("w1", {}, session="s")
    store.create_render("r1", {}, [dict(TASK)])
    store.lease("w1", ["mlx"], 60_000)  # granted in Redis; the reply died with its coordinator
    store.register_worker("w1", {}, resumed=True, session="s")  # not idle: it may be running it
    assert store.get_task("r1.a")["state"] == "leased"
    store.register_worker("w1", {}, resumed=True, session="s", idle=True)
    task = store.get_task("r1.a")
    assert task["state"] == "queued" and task["lost"] == 1 and task["attempts"] == 1
    assert any(e["type"] == "task_lost" and "never got its lease" in e["reason"] for _, e in store.read_events("r1"))


def test_address_lists_follow_the_named_leader_else_the_next():
    assert parse_addresses(" a:1, b:2 ,a:1") == ["a:1", "b:2"]
    with pytest.raises(ValueError):
        parse_addresses(" , ")
    ends = Endpoints("a:1,b:2,c:3")
    assert ends.move("a:1") == "b:2"
    assert ends.move("a:1") == "b:2"  # a stale failure (another thread moved on) changes nothing
    assert ends.move("b:2", standby_details("c:3")) == "c:3"
    assert ends.move("c:3", standby_details("d:4")) == "d:4" and ends.addresses[-1] == "d:4"
    assert leader_hint(standby_details("")) is None and ends.move("d:4") == "a:1"


@pytest.mark.timeout(60)
def test_a_standby_answers_unavailable_with_the_leaders_address_then_takes_over(redis_url, tmp_data):
    from coordinator.server import serve, stop
    from coordinator.state.redis_server import connect

    token = "t" * 16
    # A 3 s lease: a host that stalls this process for a second must not hand the lead to the standby early.
    lead, lead_port = serve(FarmStore(connect(redis_url)), tmp_data, token=token, leader_lease_ms=3000)
    standby, standby_port = serve(FarmStore(connect(redis_url)), tmp_data, token=token, leader_lease_ms=3000)
    meta = (("authorization", f"Bearer {token}"),)
    token = join_token(tmp_data, token)
    channel = farm_channel(f"127.0.0.1:{standby_port}", token)
    stub = farm_pb2_grpc.FarmClientStub(channel)
    try:
        assert lead.leadership.leading and not standby.leadership.leading
        with pytest.raises(grpc.RpcError) as err:
            stub.ListRenders(farm_pb2.ListRendersRequest(), timeout=5, metadata=meta)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert leader_hint(err.value.details()) == f"127.0.0.1:{lead_port}"
        from farm_cli.client import FarmClient

        with FarmClient(f"127.0.0.1:{standby_port},127.0.0.1:{lead_port}", token) as farm:
            assert farm.list() == [] and farm.address == f"127.0.0.1:{lead_port}"  # found by its health
        stop(lead)  # hands the lease back: the standby leads at its next claim (lease_ms / 8)
        deadline = time.monotonic() + 15
        while not standby.leadership.serving.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stub.ListRenders(farm_pb2.ListRendersRequest(), timeout=5, metadata=meta).renders == []
    finally:  # both, whatever failed: a coordinator left leading would take the lead in the tests after
        channel.close()
        stop(lead)  # (a second stop of the lead is a no-op: it resigns only a lease it holds)
        stop(standby)
