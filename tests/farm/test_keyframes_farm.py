"""A first (`replace`) and a last (`guide`) image with tiled stage 2 and tiled decode: the farm computes
every task's output bit for bit as `farm render --local` does, on 3 workers (the plan, its tiles named in
the spec, is the same on 2); each image is its own encode task per stage resolution, after the same H.264
CRF round trip on whichever worker takes it. One farm for the module, on the session's tiny and tiny25."""

from __future__ import annotations

import time

import numpy as np
import pytest

from farm_cli.local import render_local
from farm_cli.remote import latents_from_outputs
from protos.tensors import decode_tensor, encode_tensor
from tests.farm.farm_harness import assert_identical, farm, wait_done

# 9 frames: the tasks (2x2 stage-2 tiles, both decode tiles, the image encodes) of 25, in less compute.
SPEC = {"prompt": "a fox", "height": 256, "width": 384, "frames": 9, "frame_rate": 24.0, "seed": 11, "pack": "tiny",
        "stage2_tiles": "2x2", "tile_overlap": 2, "decode_tiles": "32,256,256"}
IMAGES = [{"frame": 0, "strength": 1.0, "binding": "replace"}, {"frame": "last", "strength": 0.8, "binding": "guide"}]
FIRST = (np.arange(96 * 128 * 3) % 251).astype(np.uint8).reshape(96, 128, 3)
LAST = np.ascontiguousarray(FIRST[::-1, ::-1])


@pytest.fixture(scope="module")
def reference(local_runner, tmp_path_factory):
    folder = tmp_path_factory.mktemp("keyframes-local")
    _, outputs, blobs = render_local({**SPEC, "images": IMAGES}, folder / "local.mp4", local_runner, [FIRST, LAST])
    shas = {tid.removeprefix("local."): out for tid, out in outputs.items()}
    return latents_from_outputs(outputs, "local", blobs.get), shas


def _registered(client, workers: int, pack: str = "tiny", timeout: float = 60.0) -> None:
    """Every worker has described the tiny pack, so the planner knows its generation (and CRF)."""
    deadline = time.monotonic() + timeout
    while sum(bool((w.get("packs") or {}).get(pack)) for w in client.workers()) < workers:
        assert time.monotonic() < deadline, "the workers did not describe their packs"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def keyframes_farm(mstore, packs25, tmp_path_factory):
    """The module's farm: 3 workers on the session's tiny (2.3) and tiny25 packs."""
    with farm(mstore, tmp_path_factory.mktemp("keyframes-data"), packs25, workers=3) as (client, _procs):
        _registered(client, 3, "tiny")
        _registered(client, 3, "tiny25")
        yield client


@pytest.mark.timeout(900)
def test_first_and_last_image_with_tiled_stage2_match_local(keyframes_farm, reference):
    arrays, local_shas = reference
    client = keyframes_farm
    blobs = [client.put_blob(encode_tensor(image)) for image in (FIRST, LAST)]
    render_id = client.submit({**SPEC, "images": [{**im, "blob": b} for im, b in zip(IMAGES, blobs, strict=True)]})
    render = wait_done(client, render_id, timeout=600)
    outputs = {t["id"]: t.get("outputs") or {} for t in render["tasks"]}
    fetch = lambda sha: decode_tensor(client.get_blob(sha))  # noqa: E731
    assert_identical(latents_from_outputs(outputs, render_id, fetch), arrays)
    tasks = {t["id"].removeprefix(f"{render_id}."): t for t in render["tasks"]}
    encodes = sorted(name for name, t in tasks.items() if t["kind"] == "image_encode")
    assert encodes == ["image1_s1", "image1_s2", "image2_s1", "image2_s2"]
    assert {tasks[n]["params"]["crf"] for n in encodes} == {33}  # the tiny pack is LTX-2.3: upstream's default
    prep = tasks["stage2.prep"]
    assert [im["binding"] for im in prep["params"]["images"]] == ["replace", "guide"]
    assert prep["params"]["images"][1]["frame"] == SPEC["frames"] - 1  # `last`, resolved by the planner
    assert sum(t["kind"] == "transformer_forward" for t in tasks.values()) == 4 * 2  # 2x2 tiles x 2 steps
    assert sum(t["kind"] == "decode_tile" for t in tasks.values()) >= 2
    farm_shas = {name: t.get("outputs") or {} for name, t in tasks.items()}
    assert farm_shas.keys() == local_shas.keys()  # the same tasks, none missing or extra on the farm
    assert farm_shas == local_shas  # every task output, bit for bit


@pytest.mark.timeout(900)
def test_generated_keyframes_and_a_guide_on_a_25_pack_match_local(keyframes_farm, runner25, tmp_path):
    spec = {**SPEC, "frames": 25, "pack": "tiny25", "stage2_tiles": None, "decode_tiles": "off",
            "num_generated_keyframes": 2, "images": [{"frame": -1, "strength": 0.9}]}
    _, outputs, _ = render_local(spec, tmp_path / "local.mp4", runner25, [LAST])
    local_shas = {tid.removeprefix("local."): out for tid, out in outputs.items()}
    client = keyframes_farm
    blob = client.put_blob(encode_tensor(LAST))
    render_id = client.submit({**spec, "images": [{**spec["images"][0], "blob": blob}]})
    render = wait_done(client, render_id, timeout=600)
    tasks = {t["id"].removeprefix(f"{render_id}."): t for t in render["tasks"]}
    assert tasks["stage1"]["params"]["generated_slots"] == [8, 16] and "slots" in tasks["stage1"]["outputs"]
    assert tasks["image1_s1"]["params"]["crf"] == 18  # LTX-2.5's default
    farm_shas = {name: t.get("outputs") or {} for name, t in tasks.items()}
    assert farm_shas.keys() == local_shas.keys()  # the same tasks, none missing or extra on the farm
    assert farm_shas == local_shas  # every task output, bit for bit
