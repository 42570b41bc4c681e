"""The gang lease in Lua, against real Redis, no processes: all or none, the degree from the
idle workers at lease time, the window, the reducer kept out, the handout through the lease reply, a
member's heartbeat, the kept step on a re-lease (coordinator/state/lua/gang.lua, sp_degree.gang_degree)."""

from __future__ import annotations

import json
import time

from coordinator.gang import handout
from coordinator.retention import prune
from coordinator.state.store import FarmStore
from coordinator.views.metrics import redis_now_ms

CAPS = {"pack_components": {"tiny": ["transformer"]}}


def _stage1(rid: str, table: list[int]) -> dict:
    params = {
        "pack": "tiny",
        "needs": ["transformer"],
        "sigmas": [1.0, 0.5, 0.0],
        "cost_s": 2.0,
        "stage1_parallel_request": "auto",
        "stage1_degrees": table,
    }
    return {
        "id": f"{rid}.stage1",
        "kind": "denoise_stage1",
        "params": params,
        "inputs": {},
        "deps": [],
        "capability": "mlx",
    }


def _lease(store: FarmStore, worker: str) -> dict | None:
    return store.lease(worker, ["mlx"], 30_000, seen=True)


def _rank(task: dict) -> tuple[int, dict]:
    params, _ = handout(task, task["params"], task.get("inputs") or {})
    return params["gang"]["rank"], params["gang"]


def test_a_gang_task_goes_to_k_workers_at_once_with_their_ranks(store: FarmStore) -> None:
    for w in ("w1", "w2", "w3", "w4"):
        store.register_worker(w, CAPS)
        assert _lease(store, w) is None  # seen idle
    store.create_render("r", {"prompt": "fox"}, [_stage1("r", [1, 2, 3, 3])])
    assert _lease(store, "w1") is None  # opens a reservation for 3 (the table's degree for 4 idle)
    assert store.get_task("r.stage1")["state"] == "queued"
    assert _lease(store, "w2") is None  # joins
    third = _lease(store, "w3")  # joins, it is full: the gang starts
    task = store.get_task("r.stage1")
    assert task["state"] == "leased" and task["worker"] == "w1"  # rank 0 holds the lease
    assert _rank(third)[0] == 2
    rank0, rank1 = _lease(store, "w1"), _lease(store, "w2")
    assert (_rank(rank0)[0], _rank(rank1)[0]) == (0, 1)
    gang = _rank(rank0)[1]
    assert gang["degree"] == 3 and gang["members"] == ["w1", "w2", "w3"] and len(set(gang["hosts"])) == 3
    assert int(rank0["fence"]) == int(rank1["fence"]) == gang["fence"]
    assert _lease(store, "w4") is None  # nothing else to do; it was never held
    assert store.heartbeat("r.stage1", "w2", int(rank1["fence"]), 30_000) == "ok"  # a member's beat
    kept = {"step": 1, "blobs": {"resume.video.latent": "ab" * 32}}
    assert store.heartbeat("r.stage1", "w1", int(rank0["fence"]), 30_000, {"step": 1, "resume": kept}) == "ok"
    assert store.heartbeat("r.stage1", "w1", int(rank0["fence"]), 30_000, {"gang_ended": True}) == "ok"
    assert store.heartbeat("r.stage1", "w2", int(rank1["fence"]), 30_000) == "stale"  # the gang ended
    assert store.fail("r.stage1", "w1", int(rank0["fence"]), "rank 0 went away") == "requeued"
    again = _lease(store, "w4")  # a plain lease now (w1..w3 not idle): it resumes at the kept step
    params, inputs = handout(again, again["params"], again.get("inputs") or {})
    assert "gang" not in params and params["resume_step"] == 1 and inputs["resume.video.latent"] == "ab" * 32


def test_an_unfilled_window_runs_with_what_it_has_and_the_reducer_never_joins(store: FarmStore) -> None:
    store.set_policy(gang_window_ms="300")
    for w in ("w1", "w2"):
        store.register_worker(w, CAPS)
        assert _lease(store, w) is None
    store.create_render("r", {"prompt": "fox"}, [_stage1("r", [1, 2])])
    assert _lease(store, "w1") is None  # wants 2
    assert store.lease("coordinator", ["coordinator", "mlx"], 30_000) is None  # the reducer takes no part
    time.sleep(0.35)
    alone = _lease(store, "w1")  # the window passed with 1 member: a plain lease
    assert (
        alone is not None
        and alone["id"] == "r.stage1"
        and "gang" not in handout(alone, alone["params"], {})[0]
    )
    store.create_render("q", {"prompt": "fox"}, [_stage1("q", [1])])  # auto on a short stage 1: never a gang
    assert _lease(store, "w2")["id"] == "q.stage1"
    assert json.loads(json.dumps(store.get_task("q.stage1")["params"]))["stage1_degrees"] == [1]


def _gang_of_two(store: FarmStore) -> None:
    """Render r's stage 1 started as a gang of w1 (rank 0, the opener) and w2."""
    for w in ("w1", "w2"):
        store.register_worker(w, CAPS)
        assert _lease(store, w) is None
    store.create_render("r", {"prompt": "fox"}, [_stage1("r", [1, 2])])
    assert _lease(store, "w1") is None  # opens for 2
    assert _rank(_lease(store, "w2"))[0] == 1  # joins, full: started


def test_rank_0_is_the_fastest_member_by_its_measured_pace(store: FarmStore) -> None:
    """The gang's members ranked by their cost ratios against the fleet's (complete.lua's EWMAs), its
    own stage-1 ratio left out (a gang's stage 1 is credited to its rank 0); unmeasured = the fleet's pace."""
    for w in ("w1", "w2", "w3"):
        store.register_worker(w, CAPS)
        assert _lease(store, w) is None
    store.client.hset(store.key("costratio_fleet"), mapping={"decode_video": "1.0", "denoise_stage2": "2.0"})
    store.client.hset(store.key("costratio", "w1"), mapping={"decode_video": "1.5", "denoise_stage2": "3.2"})
    store.client.hset(store.key("costratio", "w3"), mapping={"decode_video": "0.5", "denoise_stage1": "9"})
    store.create_render("r", {"prompt": "fox"}, [_stage1("r", [1, 2, 3])])
    assert _lease(store, "w1") is None and _lease(store, "w2") is None  # w1 opens, w2 joins
    third = _lease(store, "w3")  # full: starts, w3 (the fastest) rank 0, then w2 (the fleet's pace), w1
    assert _rank(third)[1]["members"] == ["w3", "w2", "w1"] and _rank(third)[0] == 0
    task = store.get_task("r.stage1")
    assert task["worker"] == "w3" and task["ranks"] == ["w3", "w2", "w1"]  # the fastest holds the lease
    assert _rank(_lease(store, "w1"))[0] == 2


def test_a_kept_step_outlives_blob_collection_and_a_deleted_render_leaves_no_gang(store: FarmStore, tmp_data) -> None:
    """Rank 0's kept step is referenced by its task (retention keeps it while the render lives), and a
    render deleted after its gang leaves no gang key, whichever members never asked again."""
    _gang_of_two(store)
    rank0 = _lease(store, "w1")
    sha = "cd" * 32
    (tmp_data / sha).write_bytes(b"kept step")
    store.put_blob_ref(sha, str(tmp_data / sha), 9)
    kept = {"step": 1, "blobs": {"resume.video.latent": sha}}
    assert store.heartbeat("r.stage1", "w1", int(rank0["fence"]), 30_000, {"step": 1, "resume": kept}) == "ok"
    later = redis_now_ms(store) + 7 * 86_400_000  # a week on: past every grace
    assert prune(store, tmp_data, older_than_s=86_400, now_ms=later).blobs == 0
    assert (tmp_data / sha).exists() and store.client.exists(store.key("blob", sha))
    assert store.cancel_render("r") and store.delete_render("r") == "deleted"
    assert not store.client.exists(store.key("gang", "r.stage1"))
    assert not store.client.sismember(store.key("gangs"), "r.stage1")
    assert prune(store, tmp_data, older_than_s=86_400, now_ms=later).blobs == 1  # the render gone: so is its step


def test_a_gangs_ranks_are_of_one_determinism_class_unless_any_class(store: FarmStore) -> None:
    for w, fingerprint in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B")):
        store.register_worker(w, {**CAPS, "fingerprint": fingerprint})
        assert _lease(store, w) is None
    store.create_render("r", {"prompt": "fox"}, [_stage1("r", [1, 2, 3, 4])])
    assert _lease(store, "a1") is None  # opens for 2: the idle workers of its class
    assert _lease(store, "b1") is None  # another class: does not join
    assert _rank(_lease(store, "a2"))[1]["members"] == ["a1", "a2"]

    store.create_render("m", {"prompt": "fox", "any_class": True}, [_stage1("m", [1, 2, 3, 4])])
    store.register_worker("a3", {**CAPS, "fingerprint": "A"})  # a1 and a2 are busy: a3 and the B class idle
    assert _lease(store, "a3") is None
    assert _lease(store, "b2") is None  # b1 still waits in no gang: asks below
    assert _rank(_lease(store, "b1"))[1]["members"] == ["a3", "b2", "b1"]


def test_every_rank_of_a_gang_is_in_its_record_events_and_schedule(store: FarmStore, capsys) -> None:
    """Rank 0 holds the lease and reports, but each rank computed: the task record, its done event,
    `farm status ID`, `farm logs` and the Gantt (one bar per rank) name every rank's worker."""
    from coordinator.views.metrics import task_view
    from coordinator.views.schedule import render_schedule
    from farm_cli.manage import print_logs
    from farm_cli.views import render_details

    _gang_of_two(store)
    running = render_schedule(store, "r")
    assert {lane["worker"] for lane in running["lanes"]} == {"w1", "w2"}, running["lanes"]
    rank0 = _lease(store, "w1")
    assert task_view(store.get_task("r.stage1"))["workers"] == ["w1", "w2"]
    assert store.complete("r.stage1", "w1", int(rank0["fence"]), {"latent": "ab" * 32}, {}) in ("ok", "render_ready")
    done = [e for _, e in store.read_events("r") if e["type"] == "task_done"]
    assert done and done[0]["workers"] == ["w1", "w2"], done
    ended = render_schedule(store, "r")
    bars = {lane["worker"]: lane["bars"] for lane in ended["lanes"]}
    assert sorted(bars) == ["w1", "w2"] and [b["rank"] for b in bars["w1"] + bars["w2"]] == [0, 1], bars
    assert ended["marks"]["retried"] == 0 and not any(b["again"] for b in bars["w1"] + bars["w2"])
    render = {**store.get_render("r"), "tasks": store.render_tasks("r")}
    assert any(line.strip().startswith("Stage 1") and line.endswith("on w1, w2") for line in render_details(render))
    print_logs(render, "stage1")
    assert "== r.stage1  done on w1, w2" in capsys.readouterr().out
