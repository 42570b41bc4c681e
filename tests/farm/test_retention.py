"""Retention on a real farm: finished renders past the cutoff leave no Redis keys, no render folder and
no blobs; a live render and a fresh upload are kept."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from coordinator.retention import FRESH_BLOB_FLOOR_S, prune
from coordinator.views.metrics import redis_now_ms
from protos.tensors import encode_tensor
from tests.farm.farm_harness import ROOT, farm, wait_done

# A finished render's Redis footprint (measured: ~30 KB for this plan's tasks and events); events are
# capped per render (FarmStore.events_maxlen) and the dependency keys go when it is done.
FINISHED_RENDER_BYTES = 64 * 1024
SPEC = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "frame_rate": 24.0, "seed": 5}


def _keys_of(store, render_id: str) -> list[str]:
    return [k for k in store.client.scan_iter(match=f"{store.prefix}:*", count=1000) if render_id in k]


def _blob_files(data) -> list:
    return [p for p in (data / "blobs").rglob("*") if p.is_file()] if (data / "blobs").is_dir() else []


@pytest.mark.timeout(300)
def test_prune_forgets_finished_renders_and_their_blobs_and_keeps_live_ones(store, tmp_data, tiny_packs) -> None:
    with farm(store, tmp_data, tiny_packs, workers=1) as (client, procs):
        finished = [client.submit({**SPEC, "seed": s}) for s in (1, 2)]
        for render_id in finished:
            wait_done(client, render_id)
        assert _blob_files(tmp_data) and all((tmp_data / "renders" / r).is_dir() for r in finished)
        procs["w1"].terminate()
        procs["w1"].wait(timeout=30)
        live = client.submit({**SPEC, "seed": 3})  # queued: no worker left to run it
        fresh = client.put_blob(b"an image on its way to a submit")
        kept = prune(store, tmp_data, older_than_s=0, now_ms=redis_now_ms(store) + 1)
        assert sorted(kept.renders) == sorted(finished)
        assert kept.blobs == 0 and store.get_blob_ref(fresh) is not None  # every blob is inside the grace period
        for render_id in finished:
            assert _keys_of(store, render_id) == [], render_id
            assert not (tmp_data / "renders" / render_id).exists()
        assert store.get_render(live)["state"] == "queued" and _keys_of(store, live)
        later = client.prune(0)  # the operator's `farm prune --older-than 0`: fresh blobs stay (the floor)
        assert later["render_ids"] == [] and later["blobs"] == 0 and store.get_blob_ref(fresh) is not None
        past_floor = redis_now_ms(store) + int(FRESH_BLOB_FLOOR_S * 1000) + 1000
        gone = prune(store, tmp_data, older_than_s=0, now_ms=past_floor, blob_grace_s=0)
        assert gone.blobs >= 2 and _blob_files(tmp_data) == []
        cli = subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", "prune", "--older-than",
                              "0", "--coordinator", client.address, "--token-file", str(tmp_data / "token")],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert cli.returncode == 0 and "forgot 0 renders and 0 blobs" in cli.stdout, cli.stderr
        assert not list(store.client.scan_iter(match=f"{store.prefix}:blob:*"))
        assert store.get_render(live) is not None


@pytest.mark.timeout(60)
def test_workers_unseen_for_a_day_are_forgotten_unless_they_hold_a_lease(store, tmp_data) -> None:
    store.register_worker("old-mac", {"packs": ["tiny"]})
    store.register_worker("busy-mac", {"packs": ["tiny"]})
    store.create_render("r1", {"frame_rate": 24}, [{"id": "r1.a", "kind": "x", "capability": "cap", "params": {},
                                                    "inputs": {}}])
    assert store.lease("busy-mac", ["cap"], 60_000)["id"] == "r1.a"
    day_later = redis_now_ms(store) + 86_400_000 + 1000
    done = prune(store, tmp_data, older_than_s=1e9, now_ms=day_later)
    assert done.workers == ["old-mac"] and done.renders == []
    assert [w["id"] for w in store.list_workers()] == ["busy-mac"]
    assert not store.client.exists(store.key("worker", "old-mac"))


@pytest.mark.timeout(300)
def test_fifty_renders_leave_no_key_blob_or_folder_after_farm_prune(store, tmp_data, tiny_packs) -> None:
    """Two renders run to the end (latents, frames, an mp4 folder), 48 more each with an uploaded image
    are cancelled: `farm prune --older-than 0` leaves no Redis key naming any of the 50, no blob record or
    file, and no render folder."""
    with farm(store, tmp_data, tiny_packs, workers=1) as (client, procs):
        finished = [client.submit({**SPEC, "seed": s}) for s in (1, 2)]
        for render_id in finished:
            wait_done(client, render_id)
        procs["w1"].terminate()
        procs["w1"].wait(timeout=30)
        cancelled = []
        for i in range(48):
            sha = client.put_blob(encode_tensor(np.full((64, 64, 3), i, dtype=np.uint8)))
            cancelled.append(client.submit({**SPEC, "seed": 100 + i, "image": {"blob": sha, "frame": 0, "strength": 1.0}}))
            client.cancel(cancelled[-1])
        renders = finished + cancelled
        assert all(_keys_of(store, r) for r in renders) and len(_blob_files(tmp_data)) > 48
        for render_id in finished:  # a finished render keeps its hash, task list, attempts (the schedule's
            # rows), capped events, a hash per task
            kinds = {k.removeprefix(f"{store.prefix}:").split(":")[0] + (":tasks" if k.endswith(":tasks") else "")
                     for k in _keys_of(store, render_id)}
            assert kinds == {"render", "render:tasks", "events", "task"}, kinds
            tasks = store.client.llen(store.key("render", render_id, "tasks"))
            assert len(_keys_of(store, render_id)) == 4 + tasks
            assert store.client.xlen(store.key("events", render_id)) <= store.events_maxlen
            used = sum(store.client.memory_usage(k) or 0 for k in _keys_of(store, render_id))
            print(f"finished render {render_id}: {len(_keys_of(store, render_id))} keys, {used} bytes in Redis")
            assert used < FINISHED_RENDER_BYTES
        cli = subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", "prune", "--older-than",
                              "0", "--coordinator", client.address, "--token-file", str(tmp_data / "token")],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert cli.returncode == 0 and "forgot 50 renders" in cli.stdout, cli.stdout + cli.stderr
        left = [k for k in store.client.scan_iter(match=f"{store.prefix}:*", count=1000)
                if any(r in k for r in renders)]
        assert left == []
        assert not any(r in m for r in renders for m in store.client.zrange(store.key("renders"), 0, -1))
        assert not any(r in m for r in renders for m in store.client.zrange(store.key("attempts"), 0, -1))
        assert not list(store.client.scan_iter(match=f"{store.prefix}:blob:*")) and _blob_files(tmp_data) == []
        assert not (tmp_data / "renders").exists() or not any((tmp_data / "renders").iterdir())
