"""`--pipeline t2a` (upstream's t2a_one_stage): its graph has no video task, its knobs default to
upstream's audio guider, video flags are refused in one line, and on the tiny dev-only pack the
task-by-task run (`farm render --local`'s run_plan) equals the engine's own audio-only guided loop and
writes a 16-bit stereo WAV of the decoded waveform, or by -o's suffix an M4A (AAC) of it, read back here."""

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


def test_an_output_other_than_a_wav_or_m4a_is_refused():
    import typer

    from farm_cli.main import _render_output
    from farm_cli.spec import AskedRender
    from protos.spec import RenderSpec

    asked = AskedRender(spec=RenderSpec.from_dict(SPEC))
    assert _render_output(asked, None).name == "render.wav"
    assert _render_output(asked, Path("x.M4A")).name == "x.M4A"
    for bad in ("x.mp4", "x.mp3"):
        with pytest.raises(typer.Exit) as refused:
            _render_output(asked, Path(bad))
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


def _decoded(path: Path) -> tuple[object, np.ndarray]:
    """(the audio stream, its decoded samples (channels, n)) of an M4A read back with PyAV."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        return stream, np.concatenate([f.to_ndarray() for f in container.decode(stream)], axis=1)


def test_the_m4a_writer_keeps_a_tone(tmp_path):
    """write_m4a on a 440 Hz tone read back: AAC stereo at its rate, the length rounded up to AAC's
    1024-sample frames, the samples in place (the encoder's priming trimmed) to within AAC's loss."""
    from coordinator.assemble.audio_file import write_m4a

    rate = 44100
    tone = (np.float32(0.5) * np.sin(2 * np.pi * 440 * np.arange(rate) / rate)).astype(np.float32)
    write_m4a(tmp_path / "tone.m4a", tone[None], rate)
    stream, decoded = _decoded(tmp_path / "tone.m4a")
    assert stream.codec_context.name == "aac" and stream.rate == rate and stream.channels == 2
    assert decoded.shape == (2, 45056)
    assert np.corrcoef(decoded[0, :rate], tone)[0, 1] > 0.999 and np.corrcoef(decoded[1, :rate], tone)[0, 1] > 0.999


def test_t2a_local_writes_an_m4a_by_its_suffix(dev_runner, tmp_path):
    """-o NAME.m4a: the same render, its waveform as AAC in an MPEG-4 audio file (nothing else left beside
    it but render.json's copy), read back: stereo at the vocoder's rate, the waveform's length, and its
    samples in place. The tiny pack's waveform is full-scale noise (|x| ~ 0.74), which AAC codes loosely
    (SNR ~ 1 dB): the bound is a loose one, and the file is byte for byte write_m4a of that waveform."""
    from coordinator.assemble.audio_file import write_m4a
    from farm_cli.local import render_local

    out, outputs, blobs = render_local(dict(SPEC), tmp_path / "bell.m4a", dev_runner)
    assert out.name == "bell.m4a" and sorted(p.name for p in tmp_path.iterdir()) == ["bell.json", "bell.m4a"]
    waveform = np.asarray(blobs.get(outputs["local.audio"]["waveform"]), np.float32)
    rate = int(blobs.get(outputs["local.audio"]["sample_rate"])[0])
    stream, decoded = _decoded(out)
    assert stream.codec_context.name == "aac" and stream.rate == rate and stream.channels == 2
    n = waveform.shape[-1]
    assert n <= decoded.shape[1] < n + 1024, (n, decoded.shape)
    want = waveform.reshape(-1, n)
    corr = [np.corrcoef(decoded[c, :n], want[min(c, want.shape[0] - 1)])[0, 1] for c in range(2)]
    print("m4a", decoded.shape, "waveform", waveform.shape, "correlation", corr)
    assert min(corr) > 0.1
    write_m4a(tmp_path / "again.m4a", waveform, rate)
    assert (tmp_path / "again.m4a").read_bytes() == out.read_bytes()
