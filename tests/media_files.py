"""Small media files written by PyAV for the media-in tests: a tone, a clip, a silent clip."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np


def write_wav(path: Path, seconds: float = 1.5, rate: int = 44100, layout: str = "stereo") -> Path:
    """A 440 Hz tone (s16 PCM) at `rate`: a rate other than the VAE's 16 kHz, so the encode resamples."""
    channels = 2 if layout == "stereo" else 1
    count = int(seconds * rate)
    tone = (np.sin(2 * np.pi * 440 * np.arange(count) / rate) * 0.5 * 32767).astype(np.int16)
    packed = np.repeat(tone[None], channels, 0).T.reshape(1, -1)
    with av.open(str(path), "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=rate, layout=layout)
        for at in range(0, count, 1024):
            chunk = np.ascontiguousarray(packed[:, at * channels : (at + 1024) * channels])
            frame = av.AudioFrame.from_ndarray(chunk, format="s16", layout=layout)
            frame.sample_rate, frame.pts = rate, at
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_clip(path: Path, frames: int = 30, width: int = 160, height: int = 96, fps: int = 24) -> Path:
    """A moving gradient, video only (MPEG-4 part 2 in mp4: no libx264 needed to write it)."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        base = np.arange(height * width * 3).reshape(height, width, 3)
        for i in range(frames):
            image = ((base + 7 * i) % 251).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def forged_long_wav(path: Path, hours: float = 37.0) -> Path:
    """A WAV header claiming `hours` of 16 kHz mono s16 over a few bytes of data."""
    rate, data = 16000, int(hours * 3600 * 16000 * 2)
    fmt = (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + rate.to_bytes(4, "little")
    fmt += (rate * 2).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    body = (
        b"WAVE"
        + b"fmt "
        + (16).to_bytes(4, "little")
        + fmt
        + b"data"
        + (data & 0xFFFFFFFF).to_bytes(4, "little")
    )
    path.write_bytes(b"RIFF" + ((36 + data) & 0xFFFFFFFF).to_bytes(4, "little") + body + bytes(64))
    return path


def write_clip_with_audio(
    path: Path, frames: int = 33, width: int = 192, height: int = 128, fps: int = 24
) -> Path:
    """Retake/extend: a moving gradient (MPEG-4 part 2) with a 440 Hz AAC tone of the same length."""
    rate = 44100
    with av.open(str(path), "w") as container:
        video = container.add_stream("mpeg4", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        audio = container.add_stream("aac", rate=rate, layout="mono")
        base = np.arange(height * width * 3).reshape(height, width, 3)
        for i in range(frames):
            image = ((base + 7 * i) % 251).astype(np.uint8)
            container.mux(video.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        count = int(frames / fps * rate)
        tone = (np.sin(2 * np.pi * 440 * np.arange(count) / rate) * 0.5).astype(np.float32)
        for at in range(0, count, 1024):
            frame = av.AudioFrame.from_ndarray(tone[None, at : at + 1024], format="fltp", layout="mono")
            frame.sample_rate, frame.pts = rate, at
            container.mux(audio.encode(frame))
        container.mux(video.encode())
        container.mux(audio.encode())
    return path


def write_ic_lora(path: Path, metadata: bool = True) -> Path:
    """The tiny pack's IC-LoRA (`reference_downscale_factor` 2 in its metadata, as upstream reads it),
    or, with `metadata=False`, the same tensors in a file that declares none."""
    import mlx.core as mx

    from ltx_engine.tiny.tiny_pack import tiny_embedded_config, write_detailing_lora

    write_detailing_lora(path, tiny_embedded_config()["transformer"], seed=3)
    if not metadata:
        mx.save_safetensors(str(path), mx.load(str(path)))
    return path
