"""--step-cache on real workers: a distilled render (stage 1 and stage 2 cached in memory, stage-2 tiles
as chains of tasks) and a guided two-stage render (each guidance pass a chain over its rounds) on 2
workers are bit-identical to `farm render --local`, skip some block stacks (counted in task metrics) and
so differ from the uncached render; a worker SIGKILLed while it holds a cached guidance pass loses only
that pass, which another worker continues from the chain's blobs, still == --local. One farm for the
module (the tiny pack and the dev-only pack), workers started as tests ask for them."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from tests.farm.farm_harness import (
    assert_identical,
    farm_results,
    local_references,
    shelf_farm,
    wait_done,
    wait_until,
)
from tests.session_fixtures import link_packs

THRESH = 1.0  # the port's "faster" setting; on the tiny packs every other interior step skips
BASE = {"prompt": "a fox", "frames": 9, "seed": 3, "decode_tiles": "off", "step_cache": THRESH}
DISTILLED = {**BASE, "pack": "tiny", "height": 128, "width": 128, "stage2_tiles": "1x2", "tile_overlap": 1,
             "stage2_sigmas": [0.909375, 0.725, 0.421875, 0.0]}
GUIDED = {**BASE, "pack": "dev", "pipeline": "two-stage", "height": 128, "width": 128, "stage1_steps": 4,
          "stage2_steps": 3, "negative_prompt": "blurry", "stg_blocks": [1]}
KILLED = {**BASE, "pack": "dev", "pipeline": "one-stage", "height": 64, "width": 64, "steps": 4,
          "negative_prompt": "blurry", "stg_blocks": [1]}
SPECS = {"distilled": DISTILLED, "two-stage": GUIDED, "killed": KILLED}


@pytest.fixture(scope="module")
def packs(tiny_packs, tiny_dev_pack, tmp_path_factory):
    return link_packs(tmp_path_factory.mktemp("cache-packs"), tiny=tiny_packs / "tiny", dev=tiny_dev_pack)


@pytest.fixture(scope="module")
def reference(packs, tmp_path_factory):
    """`--local` of a spec by name (`+plain`: without the step cache), with one warm Runner."""
    from worker.runner import Runner

    def spec_of(name: str) -> dict:
        spec = dict(SPECS[name.removesuffix("+plain")])
        if name.endswith("+plain"):
            del spec["step_cache"]
        return spec

    return local_references(Runner(packs), tmp_path_factory.mktemp, spec_of)


@pytest.fixture(scope="module")
def cache_farm(mstore, packs, tmp_path_factory):
    with shelf_farm(mstore, tmp_path_factory.mktemp("cache-farm"), packs) as module_farm:
        yield module_farm


def _registered(mstore, name: str) -> None:
    wait_until(lambda: any(w.get("id") == name for w in mstore.list_workers()), 30, f"{name} registering")


@pytest.mark.timeout(150)
def test_a_worker_killed_mid_chain_loses_only_its_pass(cache_farm, mstore, reference):
    """The module's first test. A healthy worker renders the spec once (its prompts' embeddings then
    cached) and stops; a throttled victim alone leases a cached pass past the chain's first round (its
    cache_* inputs another task's outputs); a second worker starts, the victim is SIGKILLed, the pass runs
    again on the other worker from the same blobs, nothing else runs twice, and farm == --local."""
    assert not cache_farm.procs, "runs first: the victim alone takes the passes"
    cache_farm.workers(1)
    _registered(mstore, "w1")
    wait_done(cache_farm.client, cache_farm.client.submit(dict(KILLED)), timeout=90)
    cache_farm.stop("w1")
    victim = cache_farm.start("victim", "--throttle", "10")
    _registered(mstore, "victim")
    render_id = cache_farm.client.submit(dict(KILLED))

    def victim_chained_pass():
        held = [t for t in mstore.render_tasks(render_id) if t["state"] == "leased" and t["worker"] == "victim"]
        chained = [t for t in held if t["kind"] == "guidance_pass" and int(t["params"].get("cache_step") or 0) >= 1]
        return chained and held

    held = wait_until(victim_chained_pass, 90, "the victim leasing a pass past the chain's first round")
    cache_farm.workers(1)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    render = wait_done(cache_farm.client, render_id, timeout=90)
    assert_identical(farm_results(cache_farm.client, render), reference("killed"))
    tasks = {t["id"]: t for t in mstore.render_tasks(render_id)}
    again = {tid for tid, t in tasks.items() if int(t["attempts"]) > 1}
    assert again == {t["id"] for t in held} and len(again) == 1, (again, [t["id"] for t in held])
    assert tasks[next(iter(again))]["worker"] == "w1"
    del cache_farm.procs["victim"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["distilled", "two-stage"])
def test_cached_render_on_two_workers_equals_local(name, cache_farm, reference):
    cache_farm.workers(2)
    render = wait_done(cache_farm.client, cache_farm.client.submit(dict(SPECS[name])), timeout=200)
    arrays = farm_results(cache_farm.client, render)
    assert_identical(arrays, reference(name))
    assert not np.array_equal(arrays["frames"], reference(f"{name}+plain")["frames"])  # the cache skipped
    skipped = {t["id"].split(".", 1)[1]: t["metrics"].get("step_cache_skipped") for t in render["tasks"]
               if t["kind"] in ("denoise_stage1", "denoise_stage2", "transformer_forward", "guidance_pass")}
    assert None not in skipped.values() and sum(skipped.values()) > 0, skipped
    if name == "distilled":  # stage 1 in memory (8 steps) and the tiles' chains (their middle step)
        assert skipped["stage1"] > 0 and any(v for k, v in skipped.items() if k.startswith("stage2.s1."))
