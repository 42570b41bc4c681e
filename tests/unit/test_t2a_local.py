"""`--pipeline t2a` (upstream's t2a_one_stage): its graph has no video task, its knobs default to
upstream's audio guider, video flags are refused in one line, and on the tiny dev-only pack the
task-by-task run (`farm render --local`'s run_plan) equals the engine's own audio-only guided loop and
writes a 16-bit stereo WAV of the decoded waveform."""

import re
import wave
from pathlib import Path

import numpy as np
import pytest

from coordinator.assemble.audio_file import pcm16
from coordinator.plan.recipes import guided_stage
from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from ltx_engine.rules import guidance as G
from ltx_engine.rules.schedule import ltx2_sigmas
from protos.fields import SpecError
from tests.session_fixtures import link_packs

pytestmark = pytest.mark.timeout(300)

SPEC = {"prompt": "a bell rings", "frames": 9, "pack": "dev", "pipeline": "t2a", "steps": 2, "stg_blocks": [1],
        "negative_prompt": "noise"}
AUDIO_KINDS = {"text_encode", "stage_prepare", "guidance_pass", "guide_step", "decode_audio"}


@pytest.fixture(scope="module")
def dev_runner(tiny_dev_pack, tmp_path_factory):
    from worker.runner import Runner

    return Runner(link_packs(tmp_path_factory.mktemp("devpacks"), dev=tiny_dev_pack))


def test_the_graph_is_audio_alone():
    tasks = plan_render(validate_spec(normalize_spec(SPEC), []), "r")
    kinds = [t["kind"] for t in tasks]
    assert set(kinds) == AUDIO_KINDS  # no decode, upsample, image or stage-2 task
    assert kinds.count("guidance_pass") == 2 * 3 and kinds.count("guide_step") == 2  # cond, uncond, perturbed
    prep = next(t for t in tasks if t["kind"] == "stage_prepare")
    assert prep["params"]["audio_only"] and "height" not in prep["params"]
    assert prep["params"]["audio_frames"] == round(9 / 24 * 25)  # upstream's duration -> 25 latents a second
    for t in tasks:
        if t["kind"] in ("guidance_pass", "guide_step"):
            assert t["params"]["video"] is None and t["params"]["audio"]["modality_scale"] == 1.0
            assert not any(name in t["inputs"] for name in ("latent", "video_context", "positions"))
    assert next(t for t in tasks if t["kind"] == "decode_audio")["inputs"]["latent"] == {
        "task": "r.stage1", "output": "audio_latent"}


def test_upstream_defaults():
    """ltx-pipelines' LTX-2.3 params for T2A: 30 steps, audio CFG 7, STG 1 on block 28, rescale 0.7,
    modality off (no video), skip step 0, upstream's negative prompt."""
    rec = guided_stage(normalize_spec({"prompt": "a bell", "frames": 25, "pipeline": "t2a"}))
    assert rec.sigmas == ltx2_sigmas(30) and rec.sampler == "euler"
    assert rec.audio == G.GuiderParams(cfg_scale=7.0, stg_scale=1.0, stg_blocks=(28,), rescale=0.7,
                                       modality_scale=1.0)
    assert rec.negative_prompt == G.DEFAULT_NEGATIVE_PROMPT and rec.passes == (G.COND, G.UNCOND, G.PERTURBED)


@pytest.mark.parametrize("extra,line", [
    ({"cfg_scale": 2.0}, "--cfg-scale does not apply to the t2a recipe (--pipeline t2a); it applies to: one-stage, "
                         "two-stage, two-stage-hq"),
    ({"decode_tiles": "off"}, "--decode-tiles does not apply to the t2a recipe (--pipeline t2a)"),
    ({"stage2_tiles": "1x2"}, "--stage2-tiles does not apply to the t2a recipe (--pipeline t2a)"),
    ({"hdr": True}, "--hdr does not apply to the t2a recipe (--pipeline t2a)"),
    ({"dfr": True}, "--dfr and --pipeline t2a are two recipes: give one"),
    ({"width": 768}, "-W/-H 768x256: --pipeline t2a renders only the audio track (no picture); drop them"),
    ({"audio": False}, "--no-audio: --pipeline t2a renders only the audio track; drop it"),
    ({"frames": None, "pack": "tiny25"}, "--pipeline t2a needs -f/--frames"),
])
def test_video_flags_are_refused_in_one_line(extra, line):
    fleet = [{"packs": ["tiny25"], "pack_generation": {"tiny25": "2.5"}}]
    with pytest.raises(SpecError, match=re.escape(line)) as refused:
        validate_spec(normalize_spec({**SPEC, **extra}), fleet)
    assert "\n" not in str(refused.value)


def test_an_output_other_than_a_wav_is_refused():
    import typer

    from farm_cli.main import _render_output
    from farm_cli.spec import AskedRender
    from protos.spec import RenderSpec

    asked = AskedRender(spec=RenderSpec.from_dict(SPEC))
    assert _render_output(asked, None).name == "render.wav"
    with pytest.raises(typer.Exit) as refused:
        _render_output(asked, Path("x.mp4"))
    assert refused.value.exit_code == 2


def test_pcm16_is_upstreams_cast():
    torch = pytest.importorskip("torch")
    x = np.array([[-1.5, -0.99999, -0.5, -1e-6, 0.0, 3e-5, 0.25, 0.7, 1.0, 2.0]], np.float32)
    want = (torch.clip(torch.from_numpy(np.repeat(x, 2, 0)).T, -1.0, 1.0) * 32767.0).to(torch.int16).numpy()
    np.testing.assert_array_equal(pcm16(x), want)


def test_t2a_local_equals_the_engine_loop_and_writes_the_wav(dev_runner, tmp_path):
    from farm_cli.local import render_local
    from ltx_engine.guided import guided_euler_step
    from ltx_engine.rules.sampling import LatentState

    out, outputs, blobs = render_local(dict(SPEC), tmp_path / "bell.wav", dev_runner)
    get = {name: {k: blobs.get(v) for k, v in outputs[f"local.{name}"].items()}
           for name in ("text", "negative", "stage1.prep", "stage1", "audio")}
    p = get["stage1.prep"]
    assert set(p) == {"audio_latent", "audio_mask", "audio_clean", "audio_positions"}
    audio = LatentState(p["audio_latent"], p["audio_mask"], p["audio_clean"], p["audio_positions"])
    rec = guided_stage(validate_spec(normalize_spec(SPEC), []))
    model = dev_runner.engine.model(dev_runner.pack("dev"), "transformer_dev")
    for step in range(len(rec.sigmas) - 1):
        video, audio = guided_euler_step(model, None, audio, list(rec.sigmas), step, get["text"], get["negative"],
                                         rec.video, rec.audio)
        assert video is None
    from ltx_engine.rules.tokens import unpatchify_audio

    np.testing.assert_array_equal(get["stage1"]["audio_latent"], unpatchify_audio(audio.latent, 8))
    with wave.open(str(out)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth()) == (2, 2)
        assert wav.getframerate() == int(get["audio"]["sample_rate"][0])
        samples = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").reshape(-1, 2)
    np.testing.assert_array_equal(samples, pcm16(get["audio"]["waveform"]))
