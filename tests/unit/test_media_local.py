"""The media pipelines run in process on the tiny pack (`ltx_engine.media_pipelines`, the oracle a farm
graph must equal) from latents the engine encodes itself.

A 25-frame 64x64 clip written with PyAV (libx264) is decoded and encoded with the pack's video VAE
encoder (and at 32x32 for half-size stages); the audio latent is seeded (the audio encode is its own task):
- retake of [0.4, 0.6) s (one stage, 8 steps): latent frames 0, 1, 3 and every audio token outside the
  window are bit-identical to the source's encoded latents, frame 2 and the window's audio regenerated;
  `--no-regen-audio` keeps all the audio;
- extend after / before by 1 latent frame (8 + 3 steps): stage 2's window holds the full-size encoded
  context bit for bit at its end, stage 1's audio the pinned source audio; the clip is source + 8 frames;
- IC-LoRA control (the tiny IC-LoRA fused in stage 1 only, downscale read from its metadata): attention
  strength 0 ends closer to the render without the reference than 0.5 does;
- Dub-It: the reference audio changes the generated audio and is dropped from the outputs.
"""

from __future__ import annotations

from fractions import Fraction

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine import media_pipelines
from ltx_engine.rules import extend, ic_lora
from ltx_engine.rules.retake import RetakeWindow

pytestmark = pytest.mark.timeout(120)
FPS, SIZE = 24.0, 64


def _clip(path, frames: int) -> np.ndarray:
    """A moving gradient written as H.264 with PyAV and read back: (1, 3, F, H, W) in [-1, 1]."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=Fraction(24))
        stream.width = stream.height = SIZE
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            ramp = (np.arange(SIZE)[None, :, None] * 3 + i * 9 + np.array([0, 60, 120])) % 256
            img = np.broadcast_to(ramp, (SIZE, SIZE, 3)).astype(np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        out.mux(stream.encode(None))
    with av.open(str(path)) as src:
        rgb = np.stack([f.to_ndarray(format="rgb24") for f in src.decode(video=0)])
    return (rgb.astype(np.float32) / 127.5 - 1.0).transpose(3, 0, 1, 2)[None]


@pytest.fixture(scope="module")
def media(local_runner, tmp_path_factory):
    engine, pack = local_runner.engine, local_runner.pack("tiny")
    pixels = _clip(tmp_path_factory.mktemp("media") / "source.mp4", 25)
    encoder = engine.model(pack, "vae_encoder")
    latent = np.array(encoder(mx.array(pixels)).astype(mx.float32))  # (1, 128, 4, 2, 2)
    half = np.array(encoder(mx.array(pixels[:, :, :, ::2, ::2])).astype(mx.float32))  # (1, 128, 4, 1, 1)
    audio = np.random.default_rng(7).standard_normal((1, 8, 26, 16)).astype(np.float32)
    return engine, pack, latent, half, audio, engine.encode_prompt(pack, "a fox")


def _render(contexts, frames: int = 25, size: int = SIZE) -> media_pipelines.Render:
    return media_pipelines.Render(frames, size, size, FPS, 11, contexts, extend.audio_latents(frames, FPS))


def test_retake_keeps_everything_outside_its_window(media):
    engine, pack, latent, _, audio, contexts = media
    window = RetakeWindow(0.4, 0.6).check(25 / FPS)
    out = media_pipelines.retake(engine, pack, _render(contexts), latent, audio, window)
    video, got_audio = out["video_latent"], out["audio_latent"]
    keep = [0, 1, 3]  # latent frame 2 spans pixel frames [9, 17) = [0.375, 0.708) s
    np.testing.assert_array_equal(video[:, :, keep], latent[:, :, keep])
    assert video.shape == latent.shape and not np.allclose(video[:, :, 2], latent[:, :, 2])
    inside = [k for k in range(26) if (k * 4 - 3) * 0.01 < 0.6 and (k * 4 + 1) * 0.01 > 0.4]
    outside = [k for k in range(26) if k not in inside]
    np.testing.assert_array_equal(got_audio[:, :, outside], audio[:, :, outside])
    assert inside and not np.allclose(got_audio[:, :, inside], audio[:, :, inside])
    kept = media_pipelines.retake(
        engine, pack, _render(contexts), latent, audio, RetakeWindow(0.4, 0.6, False)
    )
    np.testing.assert_array_equal(kept["audio_latent"], audio)
    np.testing.assert_array_equal(kept["video_latent"][:, :, keep], latent[:, :, keep])


@pytest.mark.parametrize("direction", ["after", "before"])
def test_extend_pins_the_source_boundary_and_its_audio(media, direction):
    engine, pack, latent, half, audio, contexts = media
    layout = extend.ExtendLayout(source_frames=25, fps=FPS, new_latent_frames=1, direction=direction)
    pin = audio[:, :, layout.source_audio_slice(audio.shape[2])]
    render = _render(contexts, layout.window_frames)
    window = media_pipelines.extend_window(engine, pack, render, layout, half, latent, pin)
    at = slice(0, 4) if direction == "after" else slice(1, 5)
    assert window["video_latent"].shape == (1, 128, 5, 2, 2) and window["audio_latent"].shape[2] == 34
    np.testing.assert_array_equal(window["video_latent"][:, :, at], latent)
    start = layout.audio_pin_start
    np.testing.assert_array_equal(window["audio_latent"][:, :, start : start + layout.context_audio], pin)
    clip = media_pipelines.extend_clip(layout, latent, audio, window)
    assert clip["video_latent"].shape[2] == 5 and (layout.output_frames - 1) // 8 + 1 == 5
    np.testing.assert_array_equal(clip["video_latent"][:, :, at], latent)
    assert clip["audio_latent"].shape[2] == extend.audio_latents(layout.output_frames, FPS) == 34


def _ic_lora(tmp_path, pack) -> str:
    from ltx_engine.tiny.tiny_pack import write_detailing_lora

    path = tmp_path / "control.safetensors"
    write_detailing_lora(path, pack.config["transformer"], seed=3)
    return str(path)


def test_ic_lora_control_reference_and_its_attention_strength(media, tmp_path):
    from ltx_engine.lora.lora import WithLoras

    engine, pack, _, half, _, contexts = media
    path = _ic_lora(tmp_path, pack)
    scale = ic_lora.control_downscale([path])
    assert scale == 2 and ic_lora.control_size(SIZE, SIZE, scale) == (32, 32)
    fused = WithLoras(pack, ((path, 1.0),))
    render = _render(contexts, size=2 * SIZE)  # stage 1 at 64 px, the control at 64 / 2 = 32 px
    runs = {}
    for name, strength in {"none": None, "0": 0.0, "0.5": 0.5}.items():
        control = (
            None
            if strength is None
            else ic_lora.ControlReference(half, attention_strength=strength, downscale=2)
        )
        runs[name] = media_pipelines.ic_lora_control(engine, fused, pack, render, control)["video_latent"]
    assert runs["none"].shape == (1, 128, 4, 4, 4)
    # strength 0 cuts the generated <-> reference self-attention only: the audio still cross-attends to
    # every video token (as upstream, the mask is the video self-attention's), so it ends closer, not equal
    off, half_on = (float(np.abs(runs[k] - runs["none"]).max()) for k in ("0", "0.5"))
    assert 0 < off < half_on


def test_dubit_reference_audio_conditions_and_is_dropped(media, tmp_path):
    from ltx_engine.lora.lora import WithLoras

    engine, pack, latent, half, audio, contexts = media
    fused = WithLoras(pack, ((_ic_lora(tmp_path, pack), 1.0),))
    render = _render(contexts, size=2 * SIZE)
    ref_half, ref_full = (
        ic_lora.ControlReference(half, downscale=2),
        ic_lora.ControlReference(latent, downscale=2),
    )
    dub = media_pipelines.dubit(engine, fused, render, ref_half, ref_full, audio)
    plain = media_pipelines.two_stage(
        engine, (fused, fused), render, {"control": ref_half}, lambda _: {"control": ref_full}
    )
    assert dub["audio_latent"].shape == plain["audio_latent"].shape == (1, 8, 26, 16)
    assert dub["video_latent"].shape == (1, 128, 4, 4, 4)
    assert not np.allclose(dub["audio_latent"], plain["audio_latent"], atol=1e-4)
