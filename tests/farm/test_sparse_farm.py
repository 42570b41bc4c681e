"""On the farm: a render with sparse stage-2 attention and float16 compute, stage 2 tiled so that
every tile forward routes (>= 4096 tokens: two tiles of 2 latent frames x 37 x 56), is bit-identical on a
1-worker farm to `farm render --local`; each tile forward carries its step's tau, and the tau changes what
a tile computes. Kept cheap (the suite's largest farm render): the fewest pixels whose tiles each reach
4096 tokens (9 frames at 1216x1792, two height tiles overlapping by all but one latent row: the decode
costs less than with 17 frames at 1024x2048 and two temporal tiles), no audio track, one untiled decode,
and the routed tile's sparse output is the local render's own, so only its dense counterpart runs again."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.plan.render import plan_render, validate_spec
from farm_cli.local import render_local
from protos.spec import RenderSpec
from tests.farm.farm_harness import assert_identical, farm, farm_results, local_results, wait_done

SPEC = {"prompt": "a fox", "height": 1216, "width": 1792, "frames": 9, "frame_rate": 24.0, "seed": 5, "pack": "tiny",
        "stage2_tiles": "2x1", "tile_overlap": 36, "sparse_attention": [1.0, 1.5], "compute_dtype": "float16",
        "audio": False, "decode_tiles": "off"}


def _tile_inputs(outputs: dict, blobs, task: dict) -> dict:
    out = {}
    for name, source in task["inputs"].items():
        sha = source["blob"] if "blob" in source else outputs[source["task"]][source["output"]]
        out[name] = blobs.get(sha)
    return out


@pytest.mark.timeout(1500)
def test_sparse_float16_tiled_render_on_the_farm_equals_local(store, tmp_data, tiny_packs, local_runner, tmp_path):
    _, outputs, blobs = render_local(SPEC, tmp_path / "local.mp4", local_runner)
    reference = local_results(outputs, blobs)
    tasks = plan_render(validate_spec(RenderSpec.from_dict(SPEC), []), "local")
    forwards = [t for t in tasks if t["kind"] == "transformer_forward"]
    assert [t["params"]["sparse_tau"] for t in forwards] == [1.0, 1.0, 1.5, 1.5]
    assert {t["params"]["compute_dtype"] for t in forwards} == {"float16"}
    tile = forwards[0]
    inputs = _tile_inputs(outputs, blobs, tile)
    assert inputs["latent"].shape[1] == 2 * 37 * 56 >= 4096
    sparse = blobs.get(outputs[tile["id"]]["velocity"])  # what the local render's tile computed, routed
    dense_params = {k: v for k, v in tile["params"].items() if k != "sparse_tau"}
    dense, _ = local_runner.run("transformer_forward", dense_params, inputs)
    assert not np.array_equal(sparse, dense["velocity"])  # the tile really routed
    with farm(store, tmp_data, tiny_packs, workers=1) as (client, _procs):
        render = wait_done(client, client.submit(SPEC), timeout=1200)
        assert render["spec"]["sparse_attention"] == [1.0, 1.5] and render["spec"]["compute_dtype"] == "float16"
        assert_identical(farm_results(client, render), reference)
