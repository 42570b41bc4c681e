"""Stage 2 of the dev recipes as planned (coordinator/plan/guided_render.py) and the step flags: two-stage's
stage 2 on dev + distilled LoRA with its audio re-noised (untiled) and discarded; two-stage HQ's res_2s
stage 2 as cond-pass tasks and guide steps with noise streams of its own; --stage1-steps /
--stage2-steps; `farm plan`'s passes-per-step line."""

import numpy as np
import pytest

from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from coordinator.reduce.guide_step import sde_noise
from protos.fields import SpecError

pytestmark = pytest.mark.timeout(60)
BASE = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "pack": "dev", "decode_tiles": "off"}


def _plan(**extra) -> dict[str, dict]:
    return {t["id"]: t for t in plan_render(validate_spec(normalize_spec({**BASE, **extra}), []), "r")}


def test_two_stage_stage2_is_dev_plus_distilled_lora_with_audio_renoised():
    tasks = _plan(pipeline="two-stage", steps=2, stg_blocks=[1])
    s2 = tasks["r.stage2"]
    assert s2["kind"] == "denoise_stage2" and s2["params"]["distilled_lora_strength"] == 1.0
    assert s2["params"]["renoise_audio"] is True and s2["params"]["needs"] == [
        "transformer_dev",
        "distilled_lora",
    ]
    assert tasks["r.audio"]["inputs"]["latent"] == {"task": "r.stage1", "output": "audio_latent"}
    assert all(
        "distilled_lora_strength" not in t["params"] for t in tasks.values() if t["kind"] == "guidance_pass"
    )


def test_tiled_two_stage_tiles_load_dev_plus_lora_and_keep_audio_frozen():
    tasks = _plan(pipeline="two-stage", steps=2, stg_blocks=[1], stage2_tiles="1x2", tile_overlap=1)
    tiles = [t for t in tasks.values() if t["kind"] == "transformer_forward"]
    assert tiles and all(t["params"]["distilled_lora_strength"] == 1.0 for t in tiles)
    assert not tasks["r.stage2.prep"]["params"].get("renoise_audio")


def test_hq_graph():
    tasks = _plan(pipeline="two-stage-hq", stage1_steps=2, stage2_steps=2)
    s1 = [t for t in tasks.values() if t["id"].startswith("r.stage1.") and t["kind"] == "guidance_pass"]
    s2 = [t for t in tasks.values() if t["id"].startswith("r.stage2.") and t["kind"] == "guidance_pass"]
    assert {t["params"]["distilled_lora_strength"] for t in s1} == {0.25} and len(s1) == 5 * 3  # STG off
    assert {t["params"]["pass"] for t in s2} == {"cond"} and len(s2) == 2 * 2 + 1
    assert {t["params"]["distilled_lora_strength"] for t in s2} == {0.5}
    steps2 = [t for t in tasks.values() if t["id"].startswith("r.stage2") and t["kind"] == "guide_step"]
    assert [t["params"]["evaluation"] for t in steps2] == ["mid", "end", "mid", "end", "final"]
    assert all(t["params"]["stream_offset"] > 200 for t in steps2)
    assert all(
        "stream_offset" not in t["params"]
        for t in tasks.values()
        if t["kind"] == "guide_step" and t["id"].startswith("r.stage1")
    )
    assert steps2[0]["params"]["sigmas"][:3] == pytest.approx([0.725, 0.421875, 0.0011])
    prep = tasks["r.stage2.prep"]
    assert prep["params"]["renoise_audio"] and prep["inputs"]["latent"] == {
        "task": "r.upsample",
        "output": "latent",
    }
    assert tasks["r.decode"]["inputs"]["latent"] == {"task": "r.stage2", "output": "video_latent"}
    assert tasks["r.audio"]["inputs"]["latent"] == {"task": "r.stage1", "output": "audio_latent"}
    assert "r.stage2" in tasks and not any(t["kind"] == "denoise_stage2" for t in tasks.values())


def test_stage2_noise_streams_are_their_own():
    a = sde_noise({"seed": 5, "step": 0}, "", (1, 4, 8), substep=True)
    b = sde_noise({"seed": 5, "step": 0, "stream_offset": 4096}, "", (1, 4, 8), substep=True)
    assert not np.array_equal(a, b)


def test_step_flags():
    two = _plan(pipeline="two-stage", stage1_steps=3, stg_blocks=[1])
    assert (
        len(two["r.stage1"]["params"]["sigmas"]) == 4
        and sum(t["kind"] == "guide_step" for t in two.values()) == 3
    )
    steps = [
        t
        for t in _plan(pipeline="one-stage", height=64, width=64, steps=3, stg_blocks=[1]).values()
        if t["kind"] == "guide_step"
    ]
    assert len(steps) == 3
    assert _plan(pipeline="two-stage", steps=1, stg_blocks=[1], stage2_steps=1)["r.stage2"]["params"][
        "sigmas"
    ] == [pytest.approx(0.421875), 0.0]


@pytest.mark.parametrize(
    "extra,line",
    [
        (
            {"pipeline": "two-stage", "stage2_steps": 4},
            "--stage2-steps 4: stage 2's sigma table has 3 steps (1..3)",
        ),
        ({"pipeline": "two-stage", "steps": 2, "stage1_steps": 3}, "--steps 2 and --stage1-steps 3 disagree"),
        ({"pipeline": "two-stage-hq", "stage1_steps": 0}, "stage1_steps 0 is outside 1..200"),
        ({"pipeline": "two-stage-hq", "stage2_steps": 10_000}, "stage2_steps 10000 is outside 1..200"),
        (
            {"pipeline": "distilled", "stage2_steps": 2},
            "--stage2-steps does not apply to the distilled recipe",
        ),
        ({"negative_prompt": "blurry"}, "--negative-prompt does not apply to the distilled recipe"),
        (
            {"pipeline": "two-stage-hq", "steps": 1},
            "--steps 1: the LTX2 schedule on two-stage-hq's stage-1 latent is not",
        ),
    ],
)
def test_step_refusals(extra, line):
    with pytest.raises(SpecError) as info:
        validate_spec(normalize_spec({**BASE, **extra}), [])
    assert line in str(info.value) and "\n" not in str(info.value)


def test_farm_plan_shows_both_stages(capsys):
    from farm_cli.plan import print_guidance
    from protos.spec import RenderSpec

    print_guidance(RenderSpec.from_dict({**BASE, "pipeline": "two-stage-hq", "stage1_steps": 2}))
    out = capsys.readouterr().out
    assert "guidance: 2 steps x 2 evaluations x 3 passes" in out
    assert (
        "stage 2: 3 steps x 2 evaluations x 1 pass (cond) + the final evaluation on dev + distilled LoRA 0.5"
        in out
    )


def test_two_stage_on_a_pack_without_the_distilled_lora_is_refused():
    held = [
        "text_encoder",
        "connector",
        "transformer",
        "transformer_dev",
        "spatial_upscaler",
        "vae_decoder",
        "audio_vae",
        "vocoder",
    ]
    fleet = [{"packs": ["p"], "pack_components": {"p": held}}]
    for pipeline in ("two-stage", "two-stage-hq"):
        with pytest.raises(SpecError) as info:
            validate_spec(normalize_spec({**BASE, "pack": "p", "pipeline": pipeline, "steps": 2}), fleet)
        assert "pack 'p' has no distilled_lora (ltx-2.3-22b-distilled-lora-384.safetensors)" in str(
            info.value
        )
    validate_spec(
        normalize_spec({**BASE, "pack": "p", "pipeline": "one-stage", "steps": 2, "stg_blocks": [1]}), fleet
    )
