"""--step-cache in the plan: the threshold on every DiT task it helps (distilled stage 1 and stage 2 in
memory; each guidance pass and each stage-2 tile a chain whose `cache_*` inputs are its previous step's
outputs, skip-step rounds left out of the chain), stage 1 never ganged, the cost model's fewer forwards,
and the refusals at submit."""

from __future__ import annotations

import math

import pytest

from coordinator.plan.render import plan_render
from coordinator.plan.resolved import RenderPlan
from protos.fields import SpecError
from protos.spec import RenderSpec

pytestmark = pytest.mark.timeout(60)
BASE = {"prompt": "a fox", "frames": 9, "seed": 3, "height": 128, "width": 128, "decode_tiles": "off"}
CACHE = ["cache_gate", "cache_residual", "cache_audio_residual", "cache_sum"]


def _plan(**raw) -> dict[str, dict]:
    return {t["id"].split(".", 1)[1]: t for t in plan_render(RenderPlan(RenderSpec.from_dict({**BASE, **raw})), "r")}


def test_distilled_stages_carry_the_threshold_and_never_gang():
    tasks = _plan(step_cache=0.5, pack="tiny")
    assert tasks["stage1"]["params"]["step_cache"] == 0.5 and tasks["stage2"]["params"]["step_cache"] == 0.5
    assert tasks["stage1"]["params"]["stage1_degrees"] == [1]
    assert "step_cache" not in _plan(pack="tiny")["stage1"]["params"]


def test_each_guidance_pass_is_a_chain_over_its_rounds():
    tasks = _plan(step_cache=1.0, pack="dev", pipeline="one-stage", height=64, width=64, steps=4, skip_step=1,
                  audio_skip_step=1)
    cond = {k: t for k, t in tasks.items() if t["kind"] == "guidance_pass" and k.endswith(".cond")}
    # skip_step 1: rounds 0 and 2 run passes, 1 and 3 reuse the guided x0 (no passes, not in the chain)
    assert sorted(cond) == ["stage1.s0.cond", "stage1.s2.cond"]
    first, second = cond["stage1.s0.cond"], cond["stage1.s2.cond"]
    assert (first["params"]["cache_step"], first["params"]["cache_steps"]) == (0, 2)
    assert (second["params"]["cache_step"], second["params"]["cache_steps"]) == (1, 2)
    assert not set(CACHE) & set(first["inputs"])
    assert {k: v["task"] for k, v in second["inputs"].items() if k in CACHE} == dict.fromkeys(CACHE, "r.stage1.s0.cond")
    uncond = tasks["stage1.s2.uncond"]["inputs"]["cache_gate"]
    assert uncond == {"task": "r.stage1.s0.uncond", "output": "cache_gate"}


def test_stage2_tiles_chain_across_steps_and_costs_fall():
    spec = dict(step_cache=1.0, pack="tiny", stage2_tiles="1x2", tile_overlap=1, stage2_sigmas=[0.909375, 0.725, 0.421875, 0.0])
    tasks, plain = _plan(**spec), _plan(**{k: v for k, v in spec.items() if k != "step_cache"})
    t = tasks["stage2.s1.t1"]
    assert (t["params"]["cache_step"], t["params"]["cache_steps"]) == (1, 3)
    assert t["inputs"]["cache_residual"] == {"task": "r.stage2.s0.t1", "output": "cache_residual"}
    assert t["params"]["cost_s"] < plain["stage2.s1.t1"]["params"]["cost_s"]  # an interior step: half run
    assert tasks["stage2.s0.t1"]["params"]["cost_s"] == plain["stage2.s0.t1"]["params"]["cost_s"]
    assert tasks["stage1"]["params"]["cost_s"] < plain["stage1"]["params"]["cost_s"]


@pytest.mark.parametrize("raw,line", [
    ({"step_cache": -0.5}, "--step-cache -0.5: the threshold must be a finite number >= 0"),
    ({"step_cache": math.inf}, "--step-cache inf: the threshold must be a finite number >= 0"),
    ({"step_cache": "fast"}, "--step-cache 'fast': the threshold must be a finite number >= 0"),
    ({"step_cache": 0.5, "stage1_parallel": 2}, "--stage1-parallel 2 with --step-cache"),
])
def test_bad_input_is_refused_in_one_line(raw, line):
    with pytest.raises(SpecError, match=None) as err:
        _plan(pack="tiny", **raw)
    assert line in str(err.value) and "\n" not in str(err.value)
