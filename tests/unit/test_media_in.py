"""Media in, the pure parts: the spec's media records, A2V's graph (the track's encode in
the audio decode's place, frozen into every stage), the source clip's tiled encode plan and its blend
on the coordinator, the resampler to the VAE's rate, and the track's window as the encoder takes it."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.plan.media import plan_video_encode
from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from coordinator.reduce.reducer import run_reduce_task
from ltx_engine.rules.audio_resample import resample
from ltx_engine.rules.audio_source import decode_window, encoder_waveform
from ltx_engine.rules.encode_tiling import blend_encoded, plan_encode_tiles
from protos.fields import SpecError
from protos.spec import RenderSpec
from tests.media_files import write_wav

SHA = "ab" * 32
BASE = {"prompt": "a fox", "height": 128, "width": 192, "frames": 25, "pack": "tiny"}
A2V = {**BASE, "audio_input": {"blob": SHA, "start": 0.5, "name": "voice.wav"}}


def _plan(raw: dict) -> dict[str, dict]:
    return {t["id"].removeprefix("r."): t for t in plan_render(validate_spec(normalize_spec(raw), []), "r")}


def test_the_spec_takes_media_records_and_refuses_malformed_ones():
    spec = RenderSpec.from_dict({**A2V, "source_video": {"blob": SHA, "name": "clip.mp4"}})
    assert spec.audio_input.start == 0.5 and spec.to_dict()["audio_input"] == A2V["audio_input"]
    assert RenderSpec.from_dict(spec.to_dict()) == spec
    for bad, line in (
        ({"blob": "nope"}, "audio_input blob"),
        ({"blob": SHA, "start": -1}, "start -1 is outside"),
        ({"blob": SHA, "gain": 2}, "must be {blob, start, name}"),
        ({"start": 1}, "names no uploaded"),
    ):
        with pytest.raises(SpecError, match=line):
            RenderSpec.from_dict({**BASE, "audio_input": bad})


def test_a2v_encodes_the_track_once_and_freezes_it_into_every_stage():
    tasks = _plan({**A2V, "stage2_tiles": "1x2", "tile_overlap": 1})
    assert "decode_audio" not in {t["kind"] for t in tasks.values()}
    encode = tasks["audio"]
    assert encode["kind"] == "audio_encode" and encode["inputs"] == {"audio": {"blob": SHA}}
    assert encode["params"]["start"] == 0.5 and encode["params"]["audio_frames"] == 26  # round(25 / 24 * 25)
    order = list(tasks)
    assert order.index("audio") < order.index("stage1")  # --local runs tasks in plan order
    latent = {"task": "r.audio", "output": "latent"}
    assert tasks["stage1"]["inputs"]["audio_latent"] == latent and "r.audio" in tasks["stage1"]["deps"]
    assert tasks["stage2.prep"]["inputs"]["audio_latent"] == latent  # the tiled stage 2 prepares from it
    sources = {t["inputs"]["audio_latent"]["task"] for t in tasks.values() if "audio_latent" in t["inputs"]}
    assert sources == {"r.audio", "r.stage2.prep"}  # the tiles' frozen audio comes from the prepared stage
    assert all(
        r != {"task": "r.stage1", "output": "audio_latent"}
        for t in tasks.values()
        for r in t["inputs"].values()
    )
    from ltx_engine.rules.components import render_components

    needs = render_components(validate_spec(normalize_spec(A2V), []).as_dict())
    assert "audio_vae" in needs and "vocoder" not in needs  # the encoder's half of the audio VAE, no vocoder


@pytest.mark.parametrize("pipeline", ["two-stage", "one-stage"])
def test_a2v_dev_freezes_the_track_in_every_guided_pass_and_stage_2(pipeline):
    """Upstream's a2vid_two_stage: the video guider's passes (the audio guider off), each on the
    prep's frozen audio state; the uncond pass's audio stream on the prompt; stage 2 never re-noises."""
    from ltx_engine.rules import guidance as G

    tasks = _plan({**A2V, "pipeline": pipeline, "stage1_steps": 2, "negative_prompt": "blurry"})
    latent = {"task": "r.audio", "output": "latent"}
    assert "decode_audio" not in {t["kind"] for t in tasks.values()}
    order = list(tasks)
    assert order.index("audio") < order.index("stage1.prep")
    assert tasks["stage1.prep"]["inputs"]["audio_latent"] == latent
    passes = {k: t for k, t in tasks.items() if t["kind"] == "guidance_pass"}
    assert sorted(passes) == sorted(f"stage1.s{i}.{p}" for i in (0, 1) for p in G.PASS_ORDER)
    for name, t in passes.items():
        assert t["inputs"]["audio_mask"] == {"task": "r.stage1.prep", "output": "audio_mask"}
        assert t["params"]["audio"] == G.params_to_dict(G.GuiderParams())  # no audio guidance
        assert t["params"]["video"] == G.params_to_dict(G.VIDEO_DEV)
        text = "r.negative" if name.endswith(".uncond") else "r.text"
        assert (
            t["inputs"]["video_context"]["task"] == text and t["inputs"]["audio_context"]["task"] == "r.text"
        )
    assert all(
        r != {"task": "r.stage1", "output": "audio_latent"}
        for t in tasks.values()
        for r in t["inputs"].values()
    )
    if pipeline == "two-stage":
        s2 = tasks["stage2"]
        assert s2["inputs"]["audio_latent"] == latent and not s2["params"].get("renoise_audio")
        assert s2["params"]["distilled_lora_strength"] == 1.0


def test_a2v_hq_freezes_the_track_in_both_res_2s_stages():
    """HQ's res_2s keeps a frozen stream as Euler does (its midpoint and finish post-process with the
    mask: mask 0 gives the clean track back), so A2V composes: both stages' preps read the encode, the
    audio guider off, stage 2 never re-noised."""
    from ltx_engine.rules import guidance as G

    tasks = _plan({**A2V, "pipeline": "two-stage-hq", "stage1_steps": 2, "stage2_steps": 1})
    latent = {"task": "r.audio", "output": "latent"}
    assert "decode_audio" not in {t["kind"] for t in tasks.values()}
    for stage in ("stage1", "stage2"):
        prep = tasks[f"{stage}.prep"]
        assert prep["inputs"]["audio_latent"] == latent and not prep["params"].get("renoise_audio")
        passes = [t for k, t in tasks.items() if k.startswith(f"{stage}.s") and t["kind"] == "guidance_pass"]
        assert passes and all(t["params"]["audio"] == G.params_to_dict(G.GuiderParams()) for t in passes)
        assert all(t["inputs"]["audio_mask"] == {"task": f"r.{stage}.prep", "output": "audio_mask"} for t in passes)
    assert {k.split(".")[1] for k in tasks if k.startswith("stage1.s")} >= {"s0a", "s0b"}  # res_2s rounds


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        ({"pipeline": "two-stage", "audio_cfg_scale": 7.0}, "--audio and --audio-cfg-scale do not compose"),
        ({"audio": False}, "drop --no-audio"),
    ],
)
def test_a2v_refuses_what_the_farm_does_not_build(extra, line):
    with pytest.raises(SpecError, match=line):
        validate_spec(normalize_spec({**A2V, **extra}), [])


def test_a_source_clip_is_one_encode_task_per_tile_and_a_coordinator_blend():
    spec = validate_spec(
        normalize_spec({**BASE, "source_video": {"blob": SHA}, "encode_tiles": "24,128"}), []
    )
    tasks, latent = plan_video_encode("r", spec)
    encodes, blend = tasks[:-1], tasks[-1]
    assert [t["kind"] for t in encodes] == ["video_encode"] * 4 and blend["capability"] == "coordinator"
    assert latent == {"task": "r.source_encode", "output": "latent"} and sorted(blend["inputs"]) == [
        "t0",
        "t1",
        "t2",
        "t3",
    ]
    assert all(t["inputs"] == {"video": {"blob": SHA}} for t in encodes)
    rng = np.random.default_rng(0)
    tiles = plan_encode_tiles(25, 128, 192, _sizes(blend))
    latents = {
        f"t{i}": rng.standard_normal((1, 4, *(s.stop - s.start for s in t.latents))).astype(np.float32)
        for i, t in enumerate(tiles)
    }
    out = run_reduce_task("video_encode_blend", blend["params"], latents)["latent"]
    assert np.array_equal(out, blend_encoded(out.shape, zip(tiles, latents.values(), strict=True)))
    with pytest.raises(SpecError, match="--encode-tiles"):
        validate_spec(normalize_spec({**BASE, "source_video": {"blob": SHA}, "encode_tiles": "7,7"}), [])


def _sizes(blend: dict):
    from ltx_engine.rules.encode_tiling import EncodeTileSizes

    t, to, s, so = blend["params"]["sizes"]
    return EncodeTileSizes(frames=t, frames_overlap=to, spatial=s, spatial_overlap=so)


def test_resampling_keeps_a_tone_and_the_reference_length():
    tone = lambda rate, n: np.sin(2 * np.pi * 440 * np.arange(n) / rate).astype(np.float32)[None]  # noqa: E731
    out = resample(tone(44100, 44100), 44100, 16000)
    assert out.shape == (1, 16000) and out.dtype == np.float32
    assert (
        np.abs(out[:, 200:-200] - tone(16000, 16000)[:, 200:-200]).max() < 2e-3
    )  # in band, away from the edges
    assert resample(np.ones((2, 10), np.float32), 16000, 16000).shape == (2, 10)
    assert resample(np.zeros((1, 1001), np.float32), 48000, 16000).shape == (1, 334)  # ceil(1001 / 3)


def test_the_window_is_cut_at_the_source_rate_and_fitted_for_the_encoder(tmp_path):
    data = np.frombuffer(
        write_wav(tmp_path / "t.wav", seconds=1.0, rate=22050, layout="mono").read_bytes(), np.uint8
    )
    wave, rate = decode_window(data, 0.25, 0.5)
    assert rate == 22050 and wave.shape == (1, round(0.5 * 22050)) and np.abs(wave).max() <= 0.51
    tail, _ = decode_window(data, 0.75, 1.0)  # the track ends first: what is there
    assert tail.shape[1] == round(0.25 * 22050)
    fitted = encoder_waveform(tail, rate, 16000, 2, 1.0)
    assert fitted.shape == (1, 2, 16000) and np.array_equal(
        fitted[0, 0], fitted[0, 1]
    )  # mono to both channels
    assert not np.any(fitted[..., 4100:])  # silence after the track


def test_the_worker_decodes_in_a_limited_child_and_a_bad_file_fails_only_the_task(tmp_path):
    from tests.media_files import write_clip
    from worker.media import MediaDecodeError, _decode, _read, tile_pixels

    clip = np.frombuffer(write_clip(tmp_path / "c.mp4", frames=12).read_bytes(), np.uint8)
    bounds = [[8, 17], [0, 64], [32, 96]]  # past the clip's 12 frames: its last frame repeats
    got = _read(_decode("video", {"pixels": bounds, "height": 64, "width": 96}, clip), np.load)
    assert got.shape == (1, 3, 9, 64, 64) and np.array_equal(got, tile_pixels(clip, bounds, 64, 96))
    assert np.array_equal(got[:, :, 3], got[:, :, 8])
    junk = np.frombuffer(np.random.default_rng(1).bytes(4096), np.uint8)
    with pytest.raises(MediaDecodeError, match="audio decode failed"):
        _decode("audio", {"start": 0.0, "seconds": 1.0}, junk)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pipeline", [[], ["--pipeline", "two-stage"]], ids=["distilled", "two-stage"])
def test_farm_plan_shows_the_audio_encode(tmp_path, pipeline):
    import subprocess
    import sys

    from tests.unit.test_plan_cli import FLEET

    (tmp_path / "fleet.toml").write_text(FLEET)
    wav = write_wav(tmp_path / "voice.wav", seconds=1.0)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from farm_cli.main import main; main()",
            "plan",
            "-p",
            "fox",
            "--fleet",
            str(tmp_path / "fleet.toml"),
            "--audio",
            str(wav),
            "--audio-start",
            "0.2",
            *pipeline,
        ],
        capture_output=True,
        text=True,
        timeout=100,
        env={"FARM_DATA": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "1 audio_encode" in result.stdout and "decode_audio" not in result.stdout
    assert ("120 guidance_pass" in result.stdout) == bool(pipeline)  # 30 steps x 4 passes


def test_a_stage_task_hands_the_media_pipelines_fields_to_the_engine(local_runner):
    """The worker's hook for the media pipelines' stage fields (`ltx_engine.media_stage.stage_fields`)."""
    params = {
        "frames": 25,
        "height": 64,
        "width": 96,
        "fps": 24.0,
        "seed": 1,
        "sigmas": [1.0, 0.0],
        "audio_frames": 26,
        "retake": [0.4, 0.6, True],
        "audio_pin_start": 3,
    }
    pin = np.zeros((1, 8, 4, 16), np.float32)
    stage = local_runner._stage(local_runner.pack("tiny"), params, {"audio_pin": pin})
    assert (stage.retake.start, stage.retake.end) == (0.4, 0.6) and stage.audio_pin_start == 3
    assert stage.audio_pin is pin and stage.control is None


def test_the_encodes_plan_under_other_names_for_the_pipelines_that_start_from_a_clip():
    from coordinator.plan.media import audio_encode_task, video_encode_tasks
    from ltx_engine.rules.encode_tiling import EncodeTileSizes

    spec = normalize_spec({**BASE, "frames": 49})
    tasks, latent = video_encode_tasks(
        "r", "boundary_s1", "tiny", SHA, (25, 64, 96), EncodeTileSizes(), first=24
    )
    assert [t["id"] for t in tasks] == ["r.boundary_s1.t0", "r.boundary_s1"] and latent[
        "task"
    ] == "r.boundary_s1"
    assert tasks[0]["params"]["first"] == 24 and tasks[0]["params"]["pixels"] == [[0, 25], [0, 64], [0, 96]]
    track = audio_encode_task("r", spec, "source_audio", blob=SHA, start=0.0)
    assert track["id"] == "r.source_audio" and track["params"]["audio_frames"] == 51  # round(49 / 24 * 25)


def test_a_video_encode_task_starts_at_its_first_frame(tmp_path):
    from tests.media_files import write_clip
    from worker.media import tile_pixels, video_encode

    class Echo:  # the encoder's input, to see which pixels the task cut
        def encode_video_tile(self, pack, video):
            return video

    clip = np.frombuffer(write_clip(tmp_path / "c.mp4", frames=12).read_bytes(), np.uint8)
    params = {"first": 3, "pixels": [[0, 9], [0, 64], [0, 64]], "height": 64, "width": 96}
    got = video_encode(Echo(), None, params, {"video": clip})["latent"]
    assert np.array_equal(got, tile_pixels(clip, [[3, 12], [0, 64], [0, 64]], 64, 96))
