"""An LTX-2.5 render without -f on the farm: the DurationHead picks its length on a worker, the coordinator
plans the rest with it, shows it before stage 1 starts and records it; the result equals `farm render
--local` without -f bit for bit. A pack without the head is refused at submit, a picked length the
render cannot take (an image frame past it) fails it in one line before stage 1, and only the plan
task's current holder can set a render's length (set_length.lua's fence)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import av
import numpy as np
import pytest

from coordinator.plan.render import DEFAULT_FRAMES, normalize_spec, plan_render, validate_spec
from farm_cli.client import FarmError
from farm_cli.local import render_local
from farm_cli.views import render_details
from ltx_engine.rules.duration import frames_for
from protos.tensors import encode_tensor
from tests.farm.farm_harness import farm, wait_done
from tests.session_fixtures import link_packs, pack_without

SPEC = {"prompt": "a fox walks through snow", "height": 64, "width": 64, "frame_rate": 24.0, "seed": 3,
        "pack": "tiny25", "decode_tiles": "off"}
IMAGE = (np.arange(64 * 64 * 3) % 251).astype(np.uint8).reshape(64, 64, 3)


@pytest.fixture(scope="module")
def packs(tiny25_pack, tmp_path_factory) -> Path:
    """The tiny LTX-2.5 pack, and a pack of its files but its DurationHead."""
    folder = link_packs(tmp_path_factory.mktemp("packs-length"), tiny25=tiny25_pack)
    pack_without(folder / "headless25", tiny25_pack, "duration_head.safetensors")
    return folder


def _frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def _registered(client, pack: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(bool((w.get("packs") or {}).get(pack)) for w in client.workers()) >= 2:
            return
        time.sleep(0.2)
    raise AssertionError("the workers did not describe their packs")


@pytest.mark.timeout(600)
def test_length_picked_on_the_farm_equals_local(store, tmp_data, packs, runner25, tmp_path):
    local_mp4, local_outputs, _ = render_local(dict(SPEC), tmp_path / "local.mp4", runner25)
    local_spec = json.loads(local_mp4.with_suffix(".json").read_text())["spec"]
    frames, seconds = local_spec["frames"], local_spec["predicted_seconds"]
    assert frames == frames_for(seconds, 24.0) and frames != DEFAULT_FRAMES  # the head's, not the default
    with farm(store, tmp_data, packs, workers=2) as (client, _procs):
        _registered(client, "tiny25")
        with pytest.raises(FarmError, match="pack 'headless25' has no duration_head .* or give -f/--frames") as info:
            client.submit({**SPEC, "pack": "headless25"})
        assert "\n" not in str(info.value) and client.list() == []  # nothing queued
        render_id = client.submit(dict(SPEC))
        render = wait_done(client, render_id, timeout=500)
        events = list(client.watch(render_id))
        mp4 = client.fetch_output(render_id, tmp_path / "farm.mp4")
        image = {"frame": frames, "strength": 1.0, "blob": client.put_blob(encode_tensor(IMAGE))}
        late = client.submit({**SPEC, "image": image})  # a frame past the length the head will pick
        list(client.watch(late, timeout=300))
        refused = client.get(late)
    assert refused["state"] == "failed" and "\n" not in refused["error"], refused
    assert f"image frame {frames} is outside 0..{frames - 1}" in refused["error"]
    assert not any(t["id"].endswith(".stage1") for t in refused["tasks"])  # failed before stage 1 was planned
    assert (render["spec"]["frames"], render["spec"]["predicted_seconds"]) == (frames, seconds)
    chosen = [i for i, e in enumerate(events) if e.get("type") == "length_chosen"]
    stage1 = [i for i, e in enumerate(events) if e.get("type") == "task_leased" and e["task"].endswith(".stage1")]
    assert len(chosen) == 1 and chosen[0] < stage1[0], "the length is shown before stage 1 starts"
    assert (events[chosen[0]]["frames"], events[chosen[0]]["seconds"]) == (frames, seconds)
    assert any(f"{seconds:.2f} s predicted -> {frames} frames" in line for line in render_details(render))
    shas = {t["id"].removeprefix(f"{render_id}."): t.get("outputs") or {} for t in render["tasks"]}
    local = {tid.removeprefix("local."): out for tid, out in local_outputs.items()}
    assert set(shas) - set(local) == {"length.head", "length.plan"}
    assert {k: shas[k] for k in local} == local  # every task output, bit for bit
    farm_frames, local_frames = _frames(mp4), _frames(local_mp4)
    assert len(farm_frames) == len(local_frames) == frames
    assert all((a == b).all() for a, b in zip(farm_frames, local_frames, strict=True))


@pytest.mark.timeout(120)
def test_only_the_plan_tasks_holder_sets_the_length(store):
    """A stale holder changes nothing; the holder's call records the spec, says so once, adds the rest;
    repeating it adds nothing and says nothing."""
    fleet = [{"packs": ["p"], "pack_generation": {"p": "2.5"}, "memory_bytes": 2**40}]
    spec = normalize_spec({"prompt": "a fox", "pack": "p"})
    spec = validate_spec(spec, fleet)
    store.create_render("r", spec.as_dict(), plan_render(spec, "r"))  # the stored view of spec + plan
    from coordinator.plan.render import continue_render

    full_spec, tasks = continue_render(spec.as_dict(), 33, 1.4, "r", fleet)
    plan = store.lease("coordinator", ["coordinator"], 5000)
    assert plan is None  # waits for the head
    text = store.lease("w", ["mlx"], 5000)
    store.complete(text["id"], "w", text["fence"], {"video_context": "a", "audio_context": "b", "context_mask": "c"}, {})
    head = store.lease("w", ["mlx"], 5000)
    store.complete(head["id"], "w", head["fence"], {"seconds": "s", "frames": "f"}, {})
    plan = store.lease("coordinator", ["coordinator"], 5000)
    assert plan["id"] == "r.length.plan"
    before = len(store.render_tasks("r"))
    assert store.set_length("r", plan["id"], "coordinator", int(plan["fence"]) + 1, full_spec, tasks) == "stale"
    assert len(store.render_tasks("r")) == before and store.get_render("r")["spec"]["frames"] is None
    assert store.set_length("r", plan["id"], "coordinator", int(plan["fence"]), full_spec, tasks) == "ok"
    assert store.get_render("r")["spec"]["frames"] == 33
    assert len(store.render_tasks("r")) == before + len(tasks) - 1  # the text task was there already
    assert store.set_length("r", plan["id"], "coordinator", int(plan["fence"]), full_spec, tasks) == "ok"
    assert len(store.render_tasks("r")) == before + len(tasks) - 1
    chosen = [e for _, e in store.read_events("r") if e.get("type") == "length_chosen"]
    assert [(e["frames"], e["seconds"], e["frame_rate"]) for e in chosen] == [(33, 1.4, 24.0)]
