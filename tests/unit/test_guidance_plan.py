"""The guided recipes' spec fields, their resolution and refusals, and a guided stage planned as pass
tasks + guide steps: run task by task on the tiny DiT (no Redis), it takes the engine's local steps bit
for bit."""

import math
import re

import numpy as np
import pytest

from coordinator.plan import guidance as PG
from coordinator.plan.graph import COORDINATOR
from coordinator.plan.recipes import guided_stage, recipe_for
from coordinator.plan.render import validate_spec
from coordinator.plan.resolved import RenderPlan
from coordinator.reduce.guide_step import guide_step
from ltx_engine.rules import guidance as G
from ltx_engine.rules import res2s
from protos.fields import SpecError
from protos.spec import RenderSpec

_stored = RenderPlan.from_stored  # a test spec as the render hash would hold it

pytestmark = pytest.mark.timeout(120)


def _recipe(plan):
    """The guided stage its recipe's rule resolves, unchecked."""
    return PG.recipe(plan, recipe_for(plan).guidance)


@pytest.mark.parametrize("raw,line", [
    ({"pipeline": "one-stage", "cfg_scale": math.inf}, "cfg_scale inf is not a finite number"),
    ({"pipeline": "one-stage", "cfg_scale": math.nan}, "is not a finite number"),
    ({"pipeline": "one-stage", "stg_scale": -1}, "stg_scale -1 is outside [0.0, 100.0]"),
    ({"pipeline": "one-stage", "rescale": 1.5}, "rescale 1.5 is outside [0.0, 1.0]"),
    ({"pipeline": "one-stage", "stg_blocks": [28, 28]}, "names a block twice"),
    ({"pipeline": "one-stage", "stg_blocks": "-3"}, "is negative"),
    ({"pipeline": "one-stage", "stg_blocks": "a,b"}, "block numbers like 28"),
    ({"pipeline": "one-stage", "steps": 0}, "steps 0 is outside 1..200"),
    ({"pipeline": "one-stage", "steps": 100_000}, "steps 100000 is outside 1..200"),
    ({"pipeline": "four-stage"}, "is not one of distilled, one-stage"),
])
def test_spec_refusals(raw, line):
    with pytest.raises(SpecError) as err:
        RenderSpec.from_dict({"prompt": "a cat", **raw})
    assert line in str(err.value) and "\n" not in str(err.value)



@pytest.mark.parametrize("raw,line", [
    ({"negative_prompt": "blurry"}, "--negative-prompt does not apply to the distilled recipe (--pipeline distilled); "
                                    "it applies to: one-stage, two-stage, two-stage-hq"),
    ({"cfg_scale": 3.0}, "--cfg-scale does not apply to the distilled recipe"),
])
def test_the_distilled_recipe_refuses_the_knobs(raw, line):
    spec = RenderSpec.from_dict({"prompt": "a cat", **raw})  # the contract types it; which recipe takes it: the planner's
    with pytest.raises(SpecError) as err:
        validate_spec(spec, [])
    assert line in str(err.value)

def test_spec_fields_round_trip():
    spec = RenderSpec.from_dict({"prompt": "a", "pipeline": "two-stage", "stg_blocks": "28,29", "cfg_scale": 4})
    assert spec.stg_blocks == (28, 29) and spec.cfg_scale == 4.0
    assert RenderSpec.from_dict(spec.to_dict()) == spec
    assert RenderSpec().pipeline == "distilled" and RenderSpec.from_dict({"prompt": "a"}).negative_prompt is None


def test_recipes_default_to_upstream():
    dev = _recipe(RenderPlan(RenderSpec.from_dict({"prompt": "a", "pipeline": "one-stage"})))
    assert dev.video == G.VIDEO_DEV and dev.audio == G.AUDIO_DEV and dev.sampler == PG.EULER
    assert len(dev.sigmas) == 31 and dev.negative_prompt == G.DEFAULT_NEGATIVE_PROMPT
    assert dev.passes == (G.COND, G.UNCOND, G.PERTURBED, G.ISOLATED) and dev.forwards_per_step() == 4
    hq = _recipe(_stored({"pipeline": "two-stage-hq"}))
    assert hq.sampler == PG.RES_2S and len(hq.sigmas) == 16 and hq.passes == (G.COND, G.UNCOND, G.ISOLATED)
    assert hq.forwards_per_step() == 6
    cfg_only = _recipe(_stored({"pipeline": "two-stage", "stg_scale": 0, "modality_scale": 1, "audio_stg_scale": 0,
                          "audio_modality_scale": 1, "steps": 8}))
    assert cfg_only.passes == (G.COND, G.UNCOND) and len(cfg_only.sigmas) == 9
    assert _recipe(_stored({"pipeline": "distilled"})) is None
    # HQ hands the scheduler its stage-1 latent (upstream's ti2vid_two_stages_hq); the others the 4096 anchor.
    from ltx_engine.rules.schedule import ltx2_sigmas

    sized = {"frames": 121, "height": 1088, "width": 1920}
    assert _recipe(_stored({"pipeline": "two-stage-hq", **sized})).sigmas == ltx2_sigmas(15, tokens=16 * 17 * 30)
    assert _recipe(_stored({"pipeline": "two-stage", **sized})).sigmas == ltx2_sigmas(30)


@pytest.mark.parametrize("spec,line", [
    ({"pipeline": "one-stage", "stg_blocks": [50]}, "--stg-blocks 50: outside the model's 48 blocks (0..47)"),
    ({"pipeline": "two-stage-hq", "stg_scale": 1.0}, "an STG scale needs --stg-blocks"),
    ({"pipeline": "one-stage", "cfg_scale": 1, "audio_cfg_scale": 1, "negative_prompt": "x"},
     "--negative-prompt needs a cfg scale other than 1"),
    ({"pipeline": "one-stage", "modality_blocks": [48]},
     "--modality-blocks 48: outside the model's 48 blocks (0..47); give --modality-blocks with blocks in that range"),
    ({"pipeline": "one-stage", "modality_blocks": []}, "--modality-blocks needs at least one block"),
    ({"pipeline": "one-stage", "modality_blocks": [1], "modality_scale": 1, "audio_modality_scale": 1},
     "--modality-blocks needs a modality scale other than 1"),
    ({"pipeline": "one-stage", "skip_step": 1, "step_cache": 0.5},
     "--skip-step 1 and --audio-skip-step 0 differ: --step-cache replays whole passes"),
])
def test_recipe_refusals(spec, line):
    with pytest.raises(SpecError, match=line.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        guided_stage(_stored(spec))


def test_stg_blocks_checked_against_the_pack_model():
    assert guided_stage(_stored({"pipeline": "one-stage", "stg_blocks": [1]}), num_layers=2) is not None
    with pytest.raises(SpecError, match="outside the model's 2 blocks"):
        guided_stage(_stored({"pipeline": "one-stage"}), num_layers=2)  # upstream's block 28 on the tiny DiT


CTX = {"prompt": {k: {"task": "r.text", "output": k} for k in ("video_context", "audio_context")},
       "negative": {k: {"task": "r.negative", "output": k} for k in ("video_context", "audio_context")}}


def test_plan_shape_euler():
    rec = _recipe(_stored({"pipeline": "one-stage", "steps": 3}))
    tasks = PG.plan_guided_stage("r", "stage1", rec, {"pack": "tiny", "seed": 5}, "r.prep", CTX)
    kinds = [t["kind"] for t in tasks]
    assert kinds == (["guidance_pass"] * 4 + ["guide_step"]) * 3
    assert tasks[-1]["id"] == "r.stage1" and tasks[-1]["capability"] == COORDINATOR
    first = tasks[:4]
    assert [t["params"]["pass"] for t in first] == list(rec.passes)
    assert all(t["deps"] == ["r.prep", "r.text"] for t in first if t["params"]["pass"] != G.UNCOND)
    assert next(t for t in first if t["params"]["pass"] == G.UNCOND)["deps"] == ["r.negative", "r.prep"]
    step1_passes = tasks[5:9]
    assert all("r.stage1.s0" in t["deps"] for t in step1_passes)  # each step reads the previous guide step
    assert sorted(tasks[4]["deps"]) == sorted({"r.prep"} | {t["id"] for t in first})


def test_plan_shape_res2s():
    rec = _recipe(_stored({"pipeline": "two-stage-hq", "steps": 2}))
    tasks = PG.plan_guided_stage("r", "stage1", rec, {"pack": "tiny", "seed": 5}, "r.prep", CTX)
    steps = [t["params"]["evaluation"] for t in tasks if t["kind"] == "guide_step"]
    assert steps == ["mid", "end", "mid", "end", "final"]
    assert sum(t["kind"] == "guidance_pass" for t in tasks) == 3 * res2s.evaluations(rec.sigmas)
    end = next(t for t in tasks if t["params"].get("evaluation") == "end")
    assert "r.stage1.s0a" in end["deps"]
    mid_pass = next(t for t in tasks if t["id"] == "r.stage1.s0b.cond")
    assert mid_pass["params"]["sigma"] == pytest.approx(math.sqrt(rec.sigmas[0] * rec.sigmas[1]), rel=1e-6)


# ---------------------------------------------------------------- run the planned tasks on the tiny DiT


@pytest.fixture(scope="module")
def tiny():
    import mlx.core as mx  # the engine's own dependency: imported plainly, never skipped

    from ltx_engine.models import patchify as P
    from ltx_engine.models.transformer import LTXModel, TransformerConfig, tiny_config

    mx.random.seed(3)
    model = LTXModel(TransformerConfig.from_config({"transformer": tiny_config()}))
    rng = np.random.default_rng(0)
    frames, h, w = 2, 2, 3
    vpos = np.array(P.video_positions(1, frames, h, w, 24.0), np.float32)
    apos = np.array(P.audio_positions(1, 5), np.float32)
    n = vpos.shape[2]
    prep = {"latent": rng.standard_normal((1, n, 128), np.float32), "positions": vpos,
            "mask": np.ones((1, n, 1), np.float32), "clean": np.zeros((1, n, 128), np.float32),
            "audio_latent": rng.standard_normal((1, 5, 128), np.float32), "audio_positions": apos,
            "audio_mask": np.ones((1, 5, 1), np.float32), "audio_clean": np.zeros((1, 5, 128), np.float32)}
    prep["mask"][:, :h * w] = 0.0  # first latent frame conditioned (clean 0 there)
    prep["latent"][:, :h * w] = 0.0

    def ctx():
        return {"video_context": rng.standard_normal((1, 7, 64), np.float32),
                "audio_context": rng.standard_normal((1, 7, 32), np.float32)}
    return model, {"r.prep": prep, "r.text": ctx(), "r.negative": ctx()}


def _execute(model, tasks, outputs):
    from ltx_engine.guided import run_pass

    outputs = dict(outputs)
    for t in tasks:
        arrays = {name: outputs[r["task"]][r["output"]] for name, r in t["inputs"].items()}
        if t["kind"] == "guidance_pass":
            contexts = {k: arrays.pop(k) for k in ("video_context", "audio_context")}
            outputs[t["id"]] = run_pass(model, t["params"], arrays, contexts)
        else:
            outputs[t["id"]] = guide_step(t["params"], arrays)
    return outputs


SPEC_TINY = {"stg_blocks": [1], "steps": 3}


def test_planned_euler_stage_equals_the_local_loop(tiny):
    from ltx_engine.guided import guided_euler_step
    from ltx_engine.rules.sampling import LatentState

    model, blobs = tiny
    rec = guided_stage(_stored({"pipeline": "one-stage", **SPEC_TINY}), num_layers=2)
    out = _execute(model, PG.plan_guided_stage("r", "stage1", rec, {"pack": "tiny", "seed": 5}, "r.prep", CTX), blobs)
    p = blobs["r.prep"]
    video = LatentState(p["latent"], p["mask"], p["clean"], p["positions"])
    audio = LatentState(p["audio_latent"], p["audio_mask"], p["audio_clean"], p["audio_positions"])
    pos = {**blobs["r.text"], "context_mask": None}
    neg = {**blobs["r.negative"], "context_mask": None}
    for step in range(len(rec.sigmas) - 1):
        video, audio = guided_euler_step(model, video, audio, list(rec.sigmas), step, pos, neg, rec.video, rec.audio)
    np.testing.assert_array_equal(out["r.stage1"]["latent"], video.latent)
    np.testing.assert_array_equal(out["r.stage1"]["audio_latent"], audio.latent)
    assert not np.array_equal(video.latent, p["latent"])


def test_planned_res2s_stage_equals_the_local_steps(tiny):
    from ltx_engine.guided import guided_x0
    from ltx_engine.rules.sampling import LatentState

    model, blobs = tiny
    rec = guided_stage(_stored({"pipeline": "two-stage-hq", **SPEC_TINY}), num_layers=2)
    out = _execute(model, PG.plan_guided_stage("r", "stage1", rec, {"pack": "tiny", "seed": 5}, "r.prep", CTX), blobs)
    p = blobs["r.prep"]
    pos, neg = {**blobs["r.text"], "context_mask": None}, {**blobs["r.negative"], "context_mask": None}
    ext = res2s.res2s_sigmas(rec.sigmas)
    v = LatentState(p["latent"], p["mask"], p["clean"], p["positions"])
    a = LatentState(p["audio_latent"], p["audio_mask"], p["audio_clean"], p["audio_positions"])
    for i in range(res2s.full_steps(rec.sigmas)):
        x0 = guided_x0(model, v, a, ext[i], pos, neg, rec.video, rec.audio)
        mids = [res2s.res2s_midpoint(s.latent, x, s.denoise_mask, s.clean_latent, ext, i,
                                     res2s.sde_noise(s.latent.shape, 5, (st + i * (1 << 20))))
                for s, x, st in ((v, x0[0], res2s.STREAM_VIDEO_SUBSTEP), (a, x0[1], res2s.STREAM_AUDIO_SUBSTEP))]
        vm, am = (s.with_latent(m.x_mid.astype(np.float32)) for s, m in zip((v, a), mids, strict=True))
        x0 = guided_x0(model, vm, am, mids[0].sub_sigma, pos, neg, rec.video, rec.audio)
        v, a = (s.with_latent(res2s.res2s_finish(m, x, s.denoise_mask, s.clean_latent, ext, i,
                                                 res2s.sde_noise(s.latent.shape, 5, st + i * (1 << 20))))
                for s, m, x, st in zip((v, a), mids, x0, (res2s.STREAM_VIDEO_STEP, res2s.STREAM_AUDIO_STEP),
                                       strict=True))
    x0 = guided_x0(model, v, a, ext[res2s.full_steps(rec.sigmas)], pos, neg, rec.video, rec.audio)
    np.testing.assert_array_equal(out["r.stage1"]["latent"], (x0[0] * p["mask"] + p["clean"] * (1 - p["mask"])))
    np.testing.assert_array_equal(out["r.stage1"]["audio_latent"], x0[1])


# One stream's guider skipping a step while the other's runs (upstream's per-modality `skip_step`): the plan
# runs the running stream's passes with the held one frozen; upstream's `_guided_denoise` (ltx-pipelines
# 1.2.0 utils/denoisers.py, transcribed below on the engine's passes) runs every pass either guider needs.
# Video cfg 1: on an audio-held round the plan runs no uncond pass, which upstream runs and discards.
ONE_HELD = {"video": {**SPEC_TINY, "steps": 4, "skip_step": 1, "modality_blocks": [1]},
            "audio": {**SPEC_TINY, "steps": 4, "audio_skip_step": 1, "cfg_scale": 1.0, "modality_blocks": [1]}}


def _upstream_guided_loop(model, rec, video, audio, pos, neg):
    """ltx-pipelines 1.2.0 `_guided_denoise` + the Euler loop: per step each guider's `should_skip_step`;
    both skip: the last x0s; else every pass either guider needs, a skipping stream disabled in them, its
    x0 the last one."""
    from ltx_engine.guided import pass_x0
    from ltx_engine.rules import sampling

    last = (None, None)
    sigmas = list(rec.sigmas)
    for step in range(len(sigmas) - 1):
        g = rec.at(sigmas[step])  # FactoryGuidedDenoiser: the guiders of this step's sigma (the stage's own without bins)
        v_skip, a_skip = G.skips_step(g.video, step), G.skips_step(g.audio, step)
        if not (v_skip and a_skip):
            frozen = "video" if v_skip else "audio" if a_skip else None
            outs = {n: pass_x0(model, n, video, audio, sigmas[step], pos, neg, g.video, g.audio, frozen=frozen)
                    for n in G.passes_needed(g.video, g.audio)}
            last = (last[0] if v_skip else G.combine(g.video, {n: o[0] for n, o in outs.items()}),
                    last[1] if a_skip else G.combine(g.audio, {n: o[1] for n, o in outs.items()}))
        video = sampling.denoise_step(video, last[0], sigmas, step)
        audio = sampling.denoise_step(audio, last[1], sigmas, step)
    return video, audio


@pytest.mark.parametrize("held", list(ONE_HELD))
def test_one_stream_held_while_the_other_runs_equals_upstreams_loop(tiny, held):

    model, blobs = tiny
    rec = guided_stage(_stored({"pipeline": "one-stage", **ONE_HELD[held]}), num_layers=2)
    tasks = PG.plan_guided_stage("r", "stage1", rec, {"pack": "tiny", "seed": 5}, "r.prep", CTX)
    prefix = "" if held == "video" else "audio_"
    steps = {t["id"]: t for t in tasks if t["kind"] == "guide_step"}
    assert [t["params"].get("held") for t in steps.values()] == [None, [prefix], None, [prefix]]
    assert [t["params"].get("keep_x0") for t in steps.values()] == [[prefix], None, [prefix], None]
    frozen = [t for t in tasks if t["kind"] == "guidance_pass" and t["params"].get("frozen")]
    assert {t["id"].split(".")[2] for t in frozen} == {"s1", "s3"} and {t["params"]["frozen"] for t in frozen} == {held}
    assert all(f"{prefix}x0" not in t["params"]["expect"] for t in frozen)
    running = rec.audio if held == "video" else rec.video
    assert len(frozen) == 2 * len(G.passes_needed(running))
    assert (G.UNCOND in {t["params"]["pass"] for t in frozen}) == (held == "video")  # video cfg 1: audio's alone
    _assert_task_by_task_is_upstreams_loop(model, rec, tasks, blobs)


def test_a_guidance_schedule_run_task_by_task_equals_upstreams_loop(tiny):
    """--guidance-schedule (sigmas 1.0, 0.87, 0.63, 0.1): the 1.0 bin guides fully, the 0.7 bin with CFG
    and modality off and the audio skipping odd steps (step 3: the video's passes with the audio frozen)."""

    model, blobs = tiny
    spec = {**SPEC_TINY, "steps": 4, "modality_blocks": [0],
            "guidance_schedule": "1.0:cfg_scale=4;0.7:cfg_scale=1,audio_cfg_scale=1,modality_scale=1,"
                                 "audio_modality_scale=1,audio_skip_step=1"}
    rec = guided_stage(_stored({"pipeline": "one-stage", **spec}), num_layers=2)
    tasks = PG.plan_guided_stage("r", "stage1", rec, {"pack": "tiny", "seed": 5}, "r.prep", CTX)
    steps = [t for t in tasks if t["kind"] == "guide_step"]
    assert [t["params"]["passes"] for t in steps] == [list(G.PASS_ORDER)] * 2 + [[G.COND, G.PERTURBED]] * 2
    assert [t["params"]["video"]["cfg_scale"] for t in steps] == [4.0, 4.0, 1.0, 1.0]
    assert [t["params"].get("held") for t in steps] == [None, None, None, ["audio_"]]
    _assert_task_by_task_is_upstreams_loop(model, rec, tasks, blobs)


@pytest.mark.parametrize("spec,line", [
    ({"guidance_schedule": "0.5:cfg_scale=2", "step_cache": 0.5}, "--guidance-schedule and --step-cache"),
    ({"guidance_schedule": "0.5:stg_scale=1", "stg_blocks": []}, "an STG scale needs --stg-blocks"),
    ({"guidance_schedule": "0.5:cfg_scale=1,audio_cfg_scale=1", "cfg_scale": 1, "audio_cfg_scale": 1,
      "negative_prompt": "x"}, "--negative-prompt needs a cfg scale other than 1"),
])
def test_guidance_schedule_refusals(spec, line):
    with pytest.raises(SpecError, match=re.escape(line)):
        guided_stage(_stored({"pipeline": "one-stage", "stg_blocks": [1], **spec}), num_layers=2)


def _assert_task_by_task_is_upstreams_loop(model, rec, tasks: list[dict], blobs: dict) -> None:
    """The plan's tasks executed one by one give upstream's guided loop's final latents, bit for bit."""
    from ltx_engine.rules.sampling import LatentState

    out = _execute(model, tasks, blobs)
    p = blobs["r.prep"]
    video = LatentState(p["latent"], p["mask"], p["clean"], p["positions"])
    audio = LatentState(p["audio_latent"], p["audio_mask"], p["audio_clean"], p["audio_positions"])
    pos, neg = {**blobs["r.text"], "context_mask": None}, {**blobs["r.negative"], "context_mask": None}
    video, audio = _upstream_guided_loop(model, rec, video, audio, pos, neg)
    np.testing.assert_array_equal(out["r.stage1"]["latent"], video.latent)
    np.testing.assert_array_equal(out["r.stage1"]["audio_latent"], audio.latent)


@pytest.mark.parametrize("embedding", [True, False])
def test_a_pass_carries_the_states_keyframe_marker_on_a_25_dit(tiny, embedding):
    """On an LTX-2.5 DiT a pass reads the marker the planner describes (`grid`: the first latent frame;
    `slot_range`: the generated slots' tokens), as upstream's passes read the state's `keyframes_mask`;
    a DiT without the embedding computes as without it."""
    import mlx.core as mx

    from ltx_engine.guided import pass_x0, run_pass
    from ltx_engine.models.transformer import LTXModel, TransformerConfig, tiny_config
    from ltx_engine.rules.sampling import LatentState

    _, blobs = tiny
    model = LTXModel(TransformerConfig.from_config({"transformer": {**tiny_config(),
                                                                    "use_keyframes_abs_pos_embedding": embedding}}))
    if embedding:
        model.keyframes_abs_pos_embedding = mx.array(np.random.default_rng(1).standard_normal((1, 64)), mx.float32)
    p, ctx = blobs["r.prep"], blobs["r.text"]
    params = {"pass": G.COND, "sigma": 0.5, "video": G.params_to_dict(G.GuiderParams()),
              "audio": G.params_to_dict(G.GuiderParams()), "marker": True, "grid": [1, 2, 3], "slot_range": [9, 12]}
    got = run_pass(model, params, dict(p), ctx)["x0"]
    video = LatentState(p["latent"], p["mask"], p["clean"], p["positions"])
    audio = LatentState(p["audio_latent"], p["audio_mask"], p["audio_clean"], p["audio_positions"])
    marker = np.zeros((1, 12, 1), np.float32)
    marker[:, :6] = marker[:, 9:12] = 1.0
    unmarked = pass_x0(model, G.COND, video, audio, 0.5, ctx, ctx, G.GuiderParams(), G.GuiderParams())[0]
    if embedding:
        np.testing.assert_array_equal(got, pass_x0(model, G.COND, video, audio, 0.5, ctx, ctx, G.GuiderParams(),
                                                   G.GuiderParams(), marker=marker)[0])
        assert not np.array_equal(got, unmarked)
    else:
        np.testing.assert_array_equal(got, unmarked)
