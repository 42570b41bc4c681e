"""The failure policy in the Lua scripts, against a real redis-server: a lost worker costs no attempt, a
raise costs one on that worker, N failures blocklist a worker for the render, a render fails only on K
distinct workers or when no worker is left, stuck tasks are flagged then taken back."""

from __future__ import annotations

import time

from coordinator.state.store import FarmStore
from protos.states import Fault
from tests.farm.test_store import task, types


def _workers(store: FarmStore, *ids: str) -> None:
    for i, w in enumerate(ids):
        store.register_worker(w, {}, session=f"s{i}")


def test_lost_worker_returns_its_leases_at_once_without_spending_an_attempt(store: FarmStore) -> None:
    _workers(store, "w1", "w2")
    store.create_render("r", {}, [task("r.a"), task("r.b")])
    a = store.lease("w1", ["mlx"], 60_000)
    assert store.lose_leases("w1", "other-session") == []  # an old stream of w1 blames nobody now
    assert store.lose_leases("w1", "s0", "w1 went away (connection broke)") == ["r.a"]
    t = store.get_task("r.a")
    assert t["state"] == "queued" and t["failures"] == 0 and t["lost"] == 1 and t["fence"] > a["fence"]
    assert store.client.zrange(store.key("ready", "mlx"), 0, -1) == ["r.a", "r.b"]  # back at the front
    assert store.complete("r.a", "w1", a["fence"], {}, {}) == "stale"
    w1 = next(w for w in store.list_workers() if w["id"] == "w1")
    assert w1["state"] == "lost" and w1["failures"] == 0 and w1["lost"] == 1
    ev = [e for _, e in store.read_events("r") if e["type"] == "task_lost"]
    assert ev and ev[0]["worker"] == "w1" and "connection broke" in ev[0]["reason"]
    assert store.lease("w2", ["mlx"], 60_000)["id"] == "r.a"


def test_a_new_process_of_a_worker_returns_the_old_ones_leases(store: FarmStore) -> None:
    store.register_worker("w1", {}, session="old")
    store.create_render("r", {}, [task("r.a")])
    store.lease("w1", ["mlx"], 60_000)
    store.register_worker("w1", {}, resumed=True, session="old")  # the same process reconnecting keeps it
    assert store.get_task("r.a")["state"] == "leased"
    store.register_worker("w1", {}, session="new")  # restarted: the old process's lease comes back
    assert store.get_task("r.a")["state"] == "queued" and store.get_task("r.a")["lost"] == 1


def test_three_failures_blocklist_a_worker_for_that_render_only(store: FarmStore) -> None:
    _workers(store, "bad", "good")
    store.create_render("r", {}, [task(f"r.{i}") for i in range(4)])
    for _ in range(3):
        t = store.lease("bad", ["mlx"], 60_000)
        assert store.fail(t["id"], "bad", t["fence"], "RuntimeError: corrupt weights") == "requeued"
    render = store.get_render("r")
    assert render["blocklist"] == ["bad"] and render["state"] == "running"
    assert next(w for w in store.list_workers() if w["id"] == "bad")["blocklisted"] == ["r"]
    assert "worker_blocklisted" in types(store, "r")
    assert store.lease("bad", ["mlx"], 60_000) is None  # every queued task is r's
    store.create_render("r2", {}, [task("r2.a")])
    assert store.lease("bad", ["mlx"], 60_000)["id"] == "r2.a"  # other renders still lease to it
    assert store.lease("good", ["mlx"], 60_000)["render"] == "r"
    assert store.clear_blocklist("r") and store.get_render("r")["blocklist"] == []
    assert next(w for w in store.list_workers() if w["id"] == "bad")["blocklisted"] == []
    assert store.lease("bad", ["mlx"], 60_000)["render"] == "r"  # a second chance
    assert not store.clear_blocklist("r")


def test_requeue_clears_the_blocklist_and_an_ended_render_unlists_it(store: FarmStore) -> None:
    _workers(store, "bad", "good")
    store.create_render("r", {}, [task(f"r.{i}") for i in range(3)])
    for _ in range(3):
        t = store.lease("bad", ["mlx"], 60_000)
        store.fail(t["id"], "bad", t["fence"], "boom")
    t = store.lease("good", ["mlx"], 60_000)
    assert store.requeue_task(t["id"]) and store.get_render("r")["blocklist"] == []
    for _ in range(3):
        t = store.lease("bad", ["mlx"], 60_000)
        store.fail(t["id"], "bad", t["fence"], "boom")
    assert store.get_render("r")["blocklist"] == ["bad"]
    store.cancel_render("r")
    assert next(w for w in store.list_workers() if w["id"] == "bad")["blocklisted"] == []
    assert store.get_render("r")["blocklist"] == ["bad"]  # the record keeps what it ended with


def test_render_fails_only_on_k_distinct_workers_and_says_which(store: FarmStore) -> None:
    _workers(store, "w1", "w2", "w3")
    store.create_render("r", {}, [task("r.a"), task("r.b")])
    for w in ("w1", "w1", "w2"):  # twice on one worker is one distinct worker
        t = store.lease(w, ["mlx"], 60_000)
        assert t["id"] == "r.a" and store.fail("r.a", w, t["fence"], f"ValueError: on {w}") == "requeued"
    t = store.lease("w3", ["mlx"], 60_000)
    assert store.fail("r.a", "w3", t["fence"], "ValueError: on w3") == "failed"
    task_a, render = store.get_task("r.a"), store.get_render("r")
    assert task_a["failed_on"] == ["w1", "w2", "w3"] and task_a["failures"] == 4
    assert render["state"] == "failed" and render["error"] == "task r.a failed on 3 workers (w1 w2 w3): ValueError: on w3"


def test_render_fails_when_no_worker_is_left_to_run_a_task(store: FarmStore) -> None:
    _workers(store, "w1", "w2")
    store.create_render("r", {}, [task("r.a"), task("r.b"), task("r.c")])
    store.lose_leases("w2", "s1")  # w2's connection broke: not counted on any more
    for i in range(3):
        t = store.lease("w1", ["mlx"], 60_000)
        status = store.fail(t["id"], "w1", t["fence"], "OSError: disk full")
        assert status == ("failed" if i == 2 else "requeued")
    render = store.get_render("r")
    assert render["state"] == "failed" and render["blocklist"] == ["w1"]
    assert render["error"].startswith("no worker left can run r.") and "(blocklisted: w1)" in render["error"]


def test_stuck_task_is_flagged_once_then_taken_back(store: FarmStore) -> None:
    _workers(store, "w1", "w2")
    store.create_render("r", {}, [task("r.fast", kind="tile"), task("r.slow", kind="tile")])
    t = store.lease("w1", ["mlx"], 60_000)
    store.complete(t["id"], "w1", t["fence"], {}, {})  # one finished tile: its kind's mean is ~0 ms
    slow = store.lease("w1", ["mlx"], 60_000)
    # The fast tile's mean is its lease-to-complete time: ~0 ms, tens of ms on a loaded machine; 0.5 s
    # running is past 4x that, and the hard floor (60 s) is far off.
    time.sleep(0.5)
    assert store.check_stuck(20, 4.0, 60_000, 10.0) == (["r.slow"], [])
    assert store.check_stuck(20, 4.0, 60_000, 10.0) == ([], [])  # flagged once
    assert store.get_task("r.slow")["stuck_ms"] > 0
    ev = [e for _, e in store.read_events("r") if e["type"] == "task_stuck"]
    assert ev and ev[0]["worker"] == "w1" and ev[0]["running_ms"] >= 20
    assert store.check_stuck(20, 4.0, 40, 1.0) == ([], ["r.slow"])
    back = store.get_task("r.slow")
    assert back["state"] == "queued" and back["failed_on"] == ["w1"] and "past the hard limit" in back["error"]
    assert store.heartbeat("r.slow", "w1", slow["fence"], 1000) == "stale"  # the worker stops
    assert store.lease("w2", ["mlx"], 60_000)["id"] == "r.slow"


def test_a_render_whose_tasks_are_done_is_due_for_assembly_until_it_ends(store: FarmStore) -> None:
    store.create_render("r", {}, [task("r.a")])
    t = store.lease("w1", ["mlx"], 60_000)
    assert store.renders_to_assemble() == []
    assert store.complete("r.a", "w1", t["fence"], {}, {}) == "render_ready"
    assert store.renders_to_assemble() == ["r"]
    store.set_render_state("r", "assembling")
    assert store.renders_to_assemble() == ["r"]
    store.set_render_state("r", "done", output="x.mp4")
    assert store.renders_to_assemble() == []


def test_reducer_leases_are_reclaimed(store: FarmStore) -> None:
    store.create_render("r", {}, [task("r.step", cap="coordinator")])
    store.lease("coordinator", ["coordinator"], 60_000)
    assert store.lose_leases("coordinator", reason="reclaimed by the coordinator") == ["r.step"]
    t = store.get_task("r.step")
    assert t["state"] == "queued" and t["failures"] == 0


def test_dashboard_requeue_clears_a_render_blocklist_and_shows_stuck_and_failures(store: FarmStore, tmp_data) -> None:
    from coordinator.dashboard import start_dashboard, stop_dashboard
    from coordinator.views.metrics import render_detail
    from tests.farm.test_dashboard import post

    _workers(store, "bad", "good")
    store.create_render("r", {}, [task(f"r.{i}") for i in range(4)])
    for _ in range(3):
        t = store.lease("bad", ["mlx"], 60_000)
        store.fail(t["id"], "bad", t["fence"], "boom")
    store.lease("good", ["mlx"], 60_000)
    time.sleep(0.01)  # a check in the lease's own millisecond sees 0 ms running, which is not past 0
    store.check_stuck(0, 1.0, 60_000, 1.0)
    detail = render_detail(store, "r")
    assert detail["render"]["blocklist"] == ["bad"]
    views = {v["id"]: v for v in detail["tasks"]}
    assert sum(v["failures"] for v in views.values()) == 3 and any(v["stuck"] for v in views.values())
    server, port = start_dashboard(store, port=0, token="sekrit", data_dir=tmp_data)
    csrf = "c" * 32
    headers = {"Authorization": "Bearer sekrit", "Cookie": f"farm_csrf={csrf}", "X-CSRF-Token": csrf}
    try:
        assert post(f"http://127.0.0.1:{port}/api/renders/r/requeue", headers) == (200, {"render": "r", "cleared": True})
    finally:
        stop_dashboard(server)
    assert store.get_render("r")["blocklist"] == []


def test_a_task_that_keeps_losing_its_workers_fails_its_render_instead_of_looping(store: FarmStore) -> None:
    """Each loss costs no attempt (the machine's fault), but a task whose worker vanishes LOST_LIMIT (8)
    times is taken to be what kills them: the render fails with one line saying so, and stops."""
    store.register_worker("w1", {}, session="s")
    store.create_render("r", {}, [task("r.poison"), task("r.other")])
    for n in range(1, 8):
        t = store.lease("w1", ["mlx"], 60_000)
        assert t["id"] == "r.poison"  # lost leases go back to the front
        assert store.lose_leases("w1", "", f"connection broke ({n})") == ["r.poison"]
        assert store.get_task("r.poison")["state"] == "queued" and store.get_render("r")["state"] == "running"
    t = store.lease("w1", ["mlx"], 60_000)
    assert store.lose_leases("w1", "", "connection broke (8)") == ["r.poison"]
    render, poison = store.get_render("r"), store.get_task("r.poison")
    assert render["state"] == "failed" and poison["state"] == "failed" and poison["lost"] == 8
    assert render["error"] == ("task r.poison lost its worker 8 times (last: connection broke (8)); "
                               "it may be what crashes them")
    assert store.lease("w1", ["mlx"], 60_000) is None  # nothing of it is left queued
    assert "render_failed" in types(store, "r")


def test_the_coordinators_own_reclaimed_leases_never_count_as_a_poison_task(store: FarmStore) -> None:
    store.register_worker("reducer", {}, session="s")
    store.create_render("r", {}, [task("r.blend", cap="coordinator")])
    for _ in range(9):
        store.lease("reducer", ["coordinator"], 60_000)
        assert store.lose_leases("reducer", "", "coordinator restarted") == ["r.blend"]
    assert store.get_task("r.blend")["state"] == "queued" and store.get_render("r")["state"] != "failed"


def test_an_error_every_worker_would_hit_fails_at_once_and_blames_nobody(store: FarmStore) -> None:
    """A permanent error, or the same unclassed text from a second worker, fails the render on that
    attempt, blocklists nobody, and `retry_render` answers fails_again; a transient one never does."""
    _workers(store, "w1", "w2", "w3")
    store.create_render("p", {}, [task("p.a")])
    t = store.lease("w1", ["mlx"], 60_000)
    assert store.fail("p.a", "w1", t["fence"], "LoRA x: cut short", fault=Fault.PERMANENT) == "failed"
    render = store.get_render("p")
    assert render["error"] == "LoRA x: cut short" and render["blocklist"] == []
    assert store.retry_render("p") == "fails_again" and store.get_render("p")["state"] == "failed"

    store.create_render("s", {}, [task("s.a")])
    for w in ("w1", "w1", "w1"):  # three times on one worker: blocklisted there, the same text proves nothing
        t = store.lease(w, ["mlx"], 60_000)
        assert store.fail("s.a", w, t["fence"], "ValueError: bad shape") == "requeued"
    assert store.get_render("s")["blocklist"] == ["w1"]
    t = store.lease("w2", ["mlx"], 60_000)
    assert store.fail("s.a", "w2", t["fence"], "ValueError: bad shape") == "failed"
    render = store.get_render("s")
    assert render["error"] == "the same error on w1 and w2: ValueError: bad shape" and render["blocklist"] == []
    assert store.retry_render("s") == "fails_again"

    store.create_render("t", {}, [task("t.a")])
    for w in ("w1", "w2"):  # out of memory on two Macs is still the Macs'
        t = store.lease(w, ["mlx"], 60_000)
        assert store.fail("t.a", w, t["fence"], "Metal: out of memory", fault=Fault.TRANSIENT) == "requeued"
    assert store.get_render("t")["state"] == "running"
