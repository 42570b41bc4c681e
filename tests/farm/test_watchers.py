"""500 concurrent watchers cannot stop the farm: one hub thread reads Redis for all of them
(coordinator/api/watchhub.py), each watcher relayed to the end; a tiled render finishes under them. The hub
gives each watcher every event after the id it asked for, once, in order, whenever it joins; the limits
(in all and per client address) answer RESOURCE_EXHAUSTED in one line and free up when a watcher leaves."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from coordinator.api.auth import auth_metadata, load_or_create_token
from coordinator.api.watchhub import END, WatchHub, backlog
from coordinator.server import serve, stop
from farm_cli.client import FarmClient
from farm_cli.follow import Outage, follow_events
from protos import farm_pb2, farm_pb2_grpc
from protos.auth import farm_channel
from protos.states import TERMINAL
from tests.farm.farm_harness import farm, start_worker

SPEC = {"prompt": "a fox", "height": 256, "width": 256, "frames": 9, "frame_rate": 24.0, "seed": 5, "pack": "tiny",
        "stage2_tiles": "2x2", "tile_overlap": 2}
WATCHERS = 500
CHANNELS = 10


@pytest.mark.timeout(420)
def test_five_hundred_watchers_are_all_relayed_and_a_tiled_render_finishes(store, tmp_data, tiny_packs) -> None:
    with farm(store, tmp_data, tiny_packs, workers=0) as (client, _):
        address, token = client.address, (tmp_data / "token").read_text().strip()
        render_id = client.submit(SPEC)
        clients = [FarmClient(address, token, timeout=30) for _ in range(CHANNELS)]
        for c in clients:
            c.list()  # channels up before the crowd
        seen: list[list[dict]] = [[] for _ in range(WATCHERS)]
        ended: list[str] = []

        def watch(i: int) -> None:  # as `farm watch` follows: a stream cut under load resumes after its last event
            for event in follow_events(clients[i % CHANNELS], render_id, Outage(limit_s=60)):
                seen[i].append(event)
            ended.append(clients[i % CHANNELS].get(render_id)["state"])

        threads = [threading.Thread(target=watch, args=(i,), daemon=True) for i in range(WATCHERS)]
        for t in threads:
            t.start()
        procs = [start_worker(address, token, tiny_packs, name, tmp_data) for name in ("w1", "w2")]
        try:
            for t in threads:
                t.join(timeout=360)
            assert len(ended) == WATCHERS and set(ended) == {"done"}, (len(ended), set(ended))
            render = client.get(render_id)
            tiles = {t["id"] for t in render["tasks"] if t["kind"] == "transformer_forward"}
            assert len(tiles) >= 4
            for events in seen:  # relayed, not polling: each watcher saw every tile finish, in stream order
                done = {e.get("task") for e in events if e.get("type") == "task_done"}
                assert tiles <= done
                ids = [tuple(map(int, e["_id"].split("-"))) for e in events]
                assert ids == sorted(set(ids))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=20)
            for c in clients:
                c.close()


@pytest.mark.timeout(60)
def test_the_hub_gives_every_watcher_each_event_after_its_id_once_whenever_it_joins(store) -> None:
    store.create_render("r1", {"frame_rate": 24}, [{"id": "r1.a", "kind": "x", "capability": "cap", "params": {},
                                                    "inputs": {}}])
    hub = WatchHub(store, TERMINAL, block_ms=200)
    first = [store.emit("r1", {"type": "task_progress", "n": n}) for n in range(5)]
    subs, got = [], {}
    stop_emitting = threading.Event()

    def emit() -> None:
        n = 5
        while not stop_emitting.is_set():
            store.emit("r1", {"type": "task_progress", "n": n})
            n += 1
            time.sleep(0.005)

    emitter = threading.Thread(target=emit, daemon=True)
    emitter.start()
    try:
        for after in ("0", first[2], "0", first[4]):  # joins at different moments and ids
            sub = hub.subscribe("r1", after)
            subs.append((after, sub, list(sub.fresh(backlog(store, "r1", after)))))
            time.sleep(0.15)
    finally:
        stop_emitting.set()
        emitter.join(timeout=5)
    store.cancel_render("r1")  # a render event: the hub reads the state and ends every watcher
    for after, sub, events in subs:
        while True:
            batches = sub.take(5.0)
            assert batches, "the hub never said the render ended"
            if any(b is END for b in batches):
                events += [e for b in batches if b is not END for e in sub.fresh(b)]
                break
            events += [e for b in batches for e in sub.fresh(b)]
        got[after, id(sub)] = [event_id for event_id, _ in events]
        hub.unsubscribe(sub)
    hub.stop()
    every = [event_id for event_id, _ in backlog(store, "r1", "0")]
    for (after, _), ids in got.items():
        assert ids == [i for i in every if after == "0" or every.index(i) > every.index(after)], after
    assert hub.watchers() == 0


@pytest.mark.timeout(90)
def test_watch_limits_answer_resource_exhausted_per_address_and_free_up(store, tmp_data) -> None:
    token = load_or_create_token(tmp_data)
    server, port = serve(store, tmp_data, token=token, watch_limit=4)  # 2 per client address
    store.create_render("r1", {"frame_rate": 24}, [{"id": "r1.a", "kind": "x", "capability": "cap", "params": {},
                                                    "inputs": {}}])
    try:
        with farm_channel(f"127.0.0.1:{port}", token) as channel:
            stub, md = farm_pb2_grpc.FarmClientStub(channel), auth_metadata(token)
            streams = [stub.Watch(farm_pb2.WatchRequest(render_id="r1"), timeout=30, metadata=md) for _ in range(2)]
            time.sleep(1.0)  # both admitted and waiting on the hub
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.Watch(farm_pb2.WatchRequest(render_id="r1"), timeout=10, metadata=md))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "\n" not in refused.value.details() and "poll" in refused.value.details()
            streams.pop().cancel()  # a watcher that leaves frees its place
            time.sleep(1.0)
            again = stub.Watch(farm_pb2.WatchRequest(render_id="r1"), timeout=30, metadata=md)
            store.cancel_render("r1")
            for stream in [*streams, again]:
                events = [e.json for e in stream]  # each ends once the render is cancelled
                assert any("cancel" in e or "render" in e for e in events), events
    finally:
        stop(server, grace=0)
