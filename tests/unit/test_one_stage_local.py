"""`--pipeline one-stage` planned and run task by task in process (`farm render --local`'s run_plan) on
the tiny dev-only pack: the negative prompt's text task, guidance passes on the dev DiT, the
coordinator's guide steps, decode; equal to the engine's own guided loop, and refused where it cannot run."""

import re

import numpy as np
import pytest

from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from protos.fields import SpecError
from tests.session_fixtures import link_packs

pytestmark = pytest.mark.timeout(300)

SPEC = {"prompt": "a fox", "height": 64, "width": 64, "frames": 9, "pack": "dev", "decode_tiles": "off",
        "pipeline": "one-stage", "steps": 2, "stg_blocks": [1], "negative_prompt": "blurry"}


@pytest.fixture(scope="module")
def dev_runner(tiny_dev_pack, tmp_path_factory):
    from worker.runner import Runner

    return Runner(link_packs(tmp_path_factory.mktemp("devpacks"), dev=tiny_dev_pack))


def test_one_stage_graph():
    tasks = plan_render(validate_spec(normalize_spec(SPEC), []), "r")
    kinds = [t["kind"] for t in tasks]
    assert kinds[:3] == ["text_encode", "text_encode", "stage_prepare"]
    assert tasks[1]["params"]["prompt"] == "blurry" and tasks[1]["params"]["text_key"] != tasks[0]["params"]["text_key"]
    assert kinds.count("guidance_pass") == 2 * 4 and kinds.count("guide_step") == 2
    assert "denoise_stage1" not in kinds and "upsample_spatial" not in kinds
    assert all(t["params"]["needs"] == ["transformer_dev"] for t in tasks if t["kind"] == "guidance_pass")
    decode = next(t for t in tasks if t["kind"] == "decode_video")
    assert decode["inputs"]["latent"] == {"task": "r.stage1", "output": "video_latent"}


@pytest.mark.parametrize("extra,line", [
    ({"pipeline": "two-stage-hq", "stage2_tiles": "1x2"}, "--stage2-tiles does not apply to the two-stage-hq recipe (--pipeline two-stage-hq); it applies to: distilled, two-stage, dfr, extend, ic-lora, dub-it"),
    ({"stage2_steps": 1}, "--stage2-steps does not apply to the one-stage recipe (--pipeline one-stage); it applies to: two-stage, two-stage-hq"),
    ({"pipeline": "two-stage", "stage2_steps": 1, "stage2_sigmas": [0.5, 0.0]}, "--stage2-steps and --stage2-sigmas"),
    ({"stage2_tiles": "1x2"}, "--stage2-tiles does not apply to the one-stage recipe (--pipeline one-stage); it applies to: distilled, two-stage,"),
    ({"stg_blocks": [60]}, "--stg-blocks 60: outside the model's 48 blocks"),
    ({"modality_blocks": [48, 3]}, "--modality-blocks 48: outside the model's 48 blocks (0..47)"),
])
def test_one_stage_refusals(extra, line):
    with pytest.raises(SpecError, match=re.escape(line)):
        validate_spec(normalize_spec({**SPEC, **extra}), [])


def test_dev_recipe_on_a_pack_without_a_dev_transformer_is_refused():
    fleet = [{"packs": ["p"], "pack_components": {"p": ["text_encoder", "connector", "transformer", "vae_decoder",
                                                         "spatial_upscaler", "audio_vae", "vocoder"]}}]
    with pytest.raises(SpecError, match=r"pack 'p' has no transformer_dev \(transformer-dev.safetensors\)"):
        validate_spec(normalize_spec({**SPEC, "pack": "p"}), fleet)


def test_one_stage_local_render_equals_the_engine_loop(dev_runner):
    from farm_cli.local import LocalBlobs, run_plan
    from ltx_engine.guided import guided_euler_step
    from ltx_engine.rules.sampling import LatentState

    plan = validate_spec(normalize_spec(SPEC), [])
    tasks = plan_render(plan, "r")
    blobs = LocalBlobs()
    upto = [t for t in tasks if t["kind"] in ("text_encode", "stage_prepare", "guidance_pass", "guide_step")]
    out = run_plan(upto, dev_runner, blobs)
    got = {k: blobs.get(v) for k, v in out["r.stage1"].items()}
    get = {name: {k: blobs.get(v) for k, v in out[f"r.{name}"].items()} for name in ("text", "negative", "stage1.prep")}
    p = get["stage1.prep"]
    video = LatentState(p["latent"], p["mask"], p["clean"], p["positions"])
    audio = LatentState(p["audio_latent"], p["audio_mask"], p["audio_clean"], p["audio_positions"])
    from coordinator.plan.recipes import guided_stage

    rec = guided_stage(plan)
    model = dev_runner.engine.model(dev_runner.pack("dev"), "transformer_dev")
    for step in range(len(rec.sigmas) - 1):
        video, audio = guided_euler_step(model, video, audio, list(rec.sigmas), step, get["text"], get["negative"],
                                         rec.video, rec.audio)
    np.testing.assert_array_equal(got["latent"], video.latent)
    np.testing.assert_array_equal(got["audio_latent"].shape[0], 1)
    assert got["video_latent"].shape == (1, 128, 2, 2, 2)
    assert not np.array_equal(get["text"]["video_context"], get["negative"]["video_context"])


def test_one_stage_renders_an_mp4(dev_runner, tmp_path):
    import av

    from farm_cli.local import render_local

    out, outputs, _ = render_local(dict(SPEC), tmp_path / "one.mp4", dev_runner)
    with av.open(str(out)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 9
    assert "r.stage1.s1.perturbed" not in outputs and any(k.endswith("stage1.s1.perturbed") for k in outputs)


def test_two_stage_graph_and_render(dev_runner, tmp_path):
    """Two-stage: the guided stage 1 at half resolution, then the distilled render's upsample and stage 2
    (on the dev-only pack its `transformer` is the dev DiT with the distilled LoRA fused)."""
    import av

    from farm_cli.local import render_local

    spec = {**SPEC, "pipeline": "two-stage", "height": 128, "width": 128}
    tasks = plan_render(validate_spec(normalize_spec(spec), []), "r")
    kinds = [t["kind"] for t in tasks]
    assert kinds.count("guidance_pass") == 8 and "denoise_stage1" not in kinds
    assert kinds.index("guide_step") < kinds.index("upsample_spatial") < kinds.index("denoise_stage2")
    prep = next(t for t in tasks if t["kind"] == "stage_prepare")
    assert (prep["params"]["height"], prep["params"]["width"]) == (64, 64)
    up = next(t for t in tasks if t["kind"] == "upsample_spatial")
    assert up["inputs"]["latent"] == {"task": "r.stage1", "output": "video_latent"}
    out, outputs, _ = render_local(dict(spec), tmp_path / "two.mp4", dev_runner)
    with av.open(str(out)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 9 and frames[0].shape == (128, 128, 3)
