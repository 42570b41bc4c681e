"""`--pipeline one-stage` on real workers: each guided step's passes are tasks any worker takes, the
coordinator combines them; farm (1 and 2 workers) equals `farm render --local` bit for bit on the tiny
dev-only pack, and bad guidance input is refused at submit with nothing queued."""

from __future__ import annotations

import pytest

from farm_cli.client import FarmError
from farm_cli.local import render_local
from tests.farm.farm_harness import assert_identical, farm, farm_results, local_results, wait_done

SPEC = {"prompt": "a fox", "height": 64, "width": 64, "frames": 9, "seed": 3, "pack": "dev", "decode_tiles": "off",
        "pipeline": "one-stage", "steps": 2, "stg_blocks": [1], "negative_prompt": "blurry"}


@pytest.fixture(scope="module")
def dev_packs(tmp_path_factory):
    from ltx_engine.tiny_pack import write_tiny_pack

    folder = tmp_path_factory.mktemp("devpacks")
    write_tiny_pack(folder / "dev", seed=0, layout="dev-only")
    return folder


TWO_STAGE = {**SPEC, "pipeline": "two-stage", "height": 128, "width": 128}


@pytest.fixture(scope="module")
def reference(dev_packs, tmp_path_factory):
    from worker.runner import Runner

    runner, done = Runner(dev_packs), {}

    def local(spec: dict) -> dict:
        key = spec["pipeline"]
        if key not in done:
            _, outputs, blobs = render_local(dict(spec), tmp_path_factory.mktemp("guided") / "local.mp4", runner)
            done[key] = local_results(outputs, blobs)
        return done[key]
    return local


@pytest.mark.timeout(600)
@pytest.mark.parametrize("spec,workers", [(SPEC, 1), (SPEC, 2), (TWO_STAGE, 2)],
                         ids=["one-stage-1", "one-stage-2", "two-stage-2"])
def test_guided_on_the_farm_equals_local(spec, workers, store, tmp_data, dev_packs, reference):
    with farm(store, tmp_data, dev_packs, workers=workers) as (client, _procs):
        render_id = client.submit(dict(spec))
        render = wait_done(client, render_id, timeout=500)
        arrays = farm_results(client, render)
    assert_identical(arrays, reference(spec))
    passes = [t for t in render["tasks"] if t["kind"] == "guidance_pass"]
    steps = [t for t in render["tasks"] if t["kind"] == "guide_step"]
    assert len(passes) == 8 and len(steps) == 2 and {t["worker"] for t in steps} == {"coordinator"}
    assert len({t["worker"] for t in passes}) == workers  # with 2 workers the passes spread over both


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bad,line", [
    ({"stg_blocks": [99]}, "--stg-blocks 99: outside the model's 48 blocks"),
    ({"cfg_scale": -1.0}, "cfg_scale -1.0 is outside [0.0, 100.0]"),
    ({"pipeline": "distilled"}, "--steps does not apply to the distilled pipeline"),
])
def test_bad_guidance_refused_at_submit(bad, line, store, tmp_data, dev_packs):
    with farm(store, tmp_data, dev_packs, workers=0) as (client, _procs):
        with pytest.raises(FarmError) as info:
            client.submit({**SPEC, **bad})
    message = str(info.value)
    assert "\n" not in message and line in message
    assert store.list_renders() == [] and not any(store.queue_depths().values())

