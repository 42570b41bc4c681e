"""The media pipelines' stages run in process on the tiny pack from latents the engine encodes itself.

A 25-frame clip written with PyAV (libx264) is decoded and encoded with the pack's video VAE encoder;
then, with the engine's `denoise_stage1` (8 distilled steps):
- retake of [0.4, 0.6) s: latent frames outside the window and audio tokens outside it are bit-identical
  to the source's encoded latents, the window's are regenerated; `--no-regen-audio` keeps all audio;
- extend after by 1 latent frame: the window's first 4 latent frames and its first 25 audio latents are
  the re-encoded source tail, bit for bit, and the assembled clip is source + 8 frames;
- IC-LoRA control (the tiny IC-LoRA fused, downscale read from its metadata): attention strength 0 ends
  closer to the render without the reference than strength 0.5;
- Dub-It: the appended reference audio changes the generated audio and is dropped from the outputs.
"""

from __future__ import annotations

from fractions import Fraction

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine import extend, ic_lora
from ltx_engine.denoise import StageInputs
from ltx_engine.media_stage import extend_context
from ltx_engine.retake import RetakeWindow
from ltx_engine.sampling import DISTILLED_SIGMAS

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
    latent = np.array(encoder(mx.array(pixels)).astype(mx.float32))
    half = np.array(encoder(mx.array(pixels[:, :, :, ::2, ::2])).astype(mx.float32))
    audio = np.random.default_rng(7).standard_normal((1, 8, 26, 16)).astype(np.float32)
    contexts = engine.encode_prompt(pack, "a fox")
    return engine, pack, latent, half, audio, contexts


def _inputs(contexts, frames: int, audio_frames: int, **kw) -> StageInputs:
    return StageInputs(
        frames=frames,
        height=SIZE,
        width=SIZE,
        fps=FPS,
        seed=11,
        sigmas=list(DISTILLED_SIGMAS),
        contexts=contexts,
        audio_frames=audio_frames,
        **kw,
    )


def test_retake_keeps_everything_outside_its_window(media):
    engine, pack, latent, _, audio, contexts = media
    window = RetakeWindow(0.4, 0.6).check(25 / FPS)
    out = engine.denoise_stage1(
        pack, _inputs(contexts, 25, 26, initial_video=latent, initial_audio=audio, retake=window)
    )
    video, got_audio = out["video_latent"], out["audio_latent"]
    assert video.shape == latent.shape
    keep = [0, 1, 3]  # latent frame 2 spans pixel frames [9, 17) = [0.375, 0.708) s
    np.testing.assert_array_equal(video[:, :, keep], latent[:, :, keep])
    assert not np.allclose(video[:, :, 2], latent[:, :, 2])
    inside = [k for k in range(26) if (k * 4 - 3) * 0.01 < 0.6 and (k * 4 + 1) * 0.01 > 0.4]
    outside = [k for k in range(26) if k not in inside]
    np.testing.assert_array_equal(got_audio[:, :, outside], audio[:, :, outside])
    assert inside and not np.allclose(got_audio[:, :, inside], audio[:, :, inside])
    kept = engine.denoise_stage1(
        pack,
        _inputs(
            contexts,
            25,
            26,
            initial_video=latent,
            initial_audio=audio,
            retake=RetakeWindow(0.4, 0.6, regen_audio=False),
        ),
    )
    np.testing.assert_array_equal(kept["audio_latent"], audio)
    np.testing.assert_array_equal(kept["video_latent"][:, :, keep], latent[:, :, keep])


def test_extend_pins_the_source_tail_and_its_audio(media):
    engine, pack, latent, _, audio, contexts = media
    layout = extend.ExtendLayout(source_frames=25, fps=FPS, new_latent_frames=1)
    pin = audio[:, :, layout.source_audio_slice(audio.shape[2])]
    inputs = _inputs(
        contexts,
        layout.window_frames,
        layout.window_audio,
        images=(extend_context(layout, latent),),
        audio_pin=pin,
        audio_pin_start=layout.audio_pin_start,
    )
    out = engine.denoise_stage1(pack, inputs)
    window, window_audio = out["video_latent"], out["audio_latent"]
    assert window.shape[2] == 5 and window_audio.shape[2] == layout.window_audio == 34
    np.testing.assert_array_equal(window[:, :, :4], latent)
    np.testing.assert_array_equal(window_audio[:, :, : layout.context_audio], pin)
    whole = extend.assemble_video(layout, latent, window)
    assert whole.shape[2] == 5 and (layout.output_frames - 1) // 8 + 1 == 5
    np.testing.assert_array_equal(whole[:, :, :4], latent)
    assert extend.assemble_audio(layout, audio, window_audio).shape[2] == extend.audio_latents(33, FPS)


def _ic_lora(tmp_path, pack) -> str:
    from ltx_engine.tiny_pack import write_detailing_lora

    path = tmp_path / "control.safetensors"
    write_detailing_lora(path, pack.config["transformer"], seed=3)
    return str(path)


def test_ic_lora_control_reference_and_its_attention_strength(media, tmp_path):
    from ltx_engine.lora import WithLoras

    engine, pack, _, half, _, contexts = media
    path = _ic_lora(tmp_path, pack)
    scale = ic_lora.control_downscale([path])
    assert scale == 2 and ic_lora.control_size(SIZE, SIZE, scale) == (32, 32)
    fused = WithLoras(pack, ((path, 1.0),))
    ref = half[:, :, :, :1, :1]  # a (1, C, 4, 1, 1) control latent at the stage's size / 2
    runs = {}
    for name, control in {
        "none": None,
        "0": ic_lora.ControlReference(ref, attention_strength=0.0, downscale=2),
        "0.5": ic_lora.ControlReference(ref, attention_strength=0.5, downscale=2),
    }.items():
        runs[name] = engine.denoise_stage1(fused, _inputs(contexts, 25, 26, control=control))["video_latent"]
    # strength 0 cuts the generated <-> reference self-attention only: the audio still cross-attends to
    # every video token (as upstream, the mask is the video self-attention's), so it ends closer, not equal
    off, half_on = (float(np.abs(runs[k] - runs["none"]).max()) for k in ("0", "0.5"))
    assert 0 < off < half_on


def test_dubit_reference_audio_conditions_and_is_dropped(media):
    engine, pack, _, half, audio, contexts = media
    video_ref = ic_lora.ControlReference(half[:, :, :, :1, :1], downscale=2)
    plain = engine.denoise_stage1(pack, _inputs(contexts, 25, 26, control=video_ref))
    dub = engine.denoise_stage1(pack, _inputs(contexts, 25, 26, control=video_ref, audio_reference=audio))
    assert dub["audio_latent"].shape == plain["audio_latent"].shape == (1, 8, 26, 16)
    assert not np.allclose(dub["audio_latent"], plain["audio_latent"], atol=1e-4)
