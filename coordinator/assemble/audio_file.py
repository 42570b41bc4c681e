"""An audio-only render's files (`--pipeline t2a`): the decoded waveform as a WAV and as an M4A, and
their render.json; the client keeps the one its `-o` names (`.wav` / `.m4a`).

Upstream's `encode_audio` writes T2A's waveform as 16-bit PCM stereo WAV at the vocoder's rate: clipped
to [-1, 1], times 32767, truncated toward zero (torch's cast to int16). The same rule is written here
with Python's `wave` (no encoder in the way), so the same waveform always gives the same bytes on the
farm and with `--local`. The M4A is the track the mp4s carry (AAC, stereo, clipped to [-1, 1], by
`encode_waveform`), in an audio-only MPEG-4 container. The whole waveform is written: there is no video
for it to end with.
"""

from __future__ import annotations

import time
import wave
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from coordinator.assemble.render_meta import build_metadata, write_metadata

WAV_FILE = "render.wav"
M4A_FILE = "render.m4a"
AUDIO_FILES = {".wav": WAV_FILE, ".m4a": M4A_FILE}  # -o's suffix -> the render's file it fetches
AUDIO_CODEC = "aac"


def stereo(waveform: np.ndarray) -> np.ndarray:
    """(channels, samples) float32 → (2, samples) clipped to [-1, 1]; mono is duplicated."""
    wave_f = np.asarray(waveform, dtype=np.float32)
    wave_f = wave_f[None] if wave_f.ndim == 1 else wave_f
    if wave_f.shape[0] == 1:
        wave_f = np.concatenate([wave_f, wave_f], axis=0)
    return np.clip(wave_f[:2], np.float32(-1.0), np.float32(1.0))


def encode_waveform(container, stream, waveform: np.ndarray, sample_rate: int) -> None:
    """The waveform through an open AAC stream of `container`, frame by frame (flushed by the caller)."""
    wave_f = stereo(waveform)
    frame_size = stream.codec_context.frame_size or 1024
    for start in range(0, wave_f.shape[1], frame_size):
        chunk = np.ascontiguousarray(wave_f[:, start : start + frame_size])
        audio_frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="stereo")
        audio_frame.sample_rate = sample_rate
        audio_frame.time_base = Fraction(1, sample_rate)
        audio_frame.pts = start
        for packet in stream.encode(audio_frame):
            container.mux(packet)


def write_m4a(path: Path, waveform: np.ndarray, rate: int) -> None:
    """The waveform as AAC in an audio-only MPEG-4 file (ffmpeg's `ipod` muxer: what .m4a names)."""
    with av.open(str(path), mode="w", format="ipod") as container:
        stream = container.add_stream(AUDIO_CODEC, rate=int(rate))
        stream.layout = "stereo"
        encode_waveform(container, stream, waveform, int(rate))
        for packet in stream.encode():
            container.mux(packet)


def pcm16(waveform: np.ndarray) -> np.ndarray:
    """(channels, samples) float → (samples, 2) int16 as upstream scales it; mono is duplicated."""
    scaled = stereo(waveform) * np.float32(32767.0)
    return np.ascontiguousarray(np.trunc(scaled).astype(np.int16).T)


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    """(samples, channels) int16 as a little-endian PCM WAV."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(int(samples.shape[1]))
        out.setsampwidth(2)
        out.setframerate(int(rate))
        out.writeframes(samples.astype("<i2").tobytes())


def assemble_audio(spec: dict, get: Callable, out_dir: Path, runs: list[dict] | None,
                   part: Callable[[Path], Path], publish: Callable[[Path], Path]) -> Path:
    """Write render.wav, render.m4a and render.json into out_dir (each staged by `part`, moved into place
    by `publish`, as the assembler stages its mp4); returns the wav (the render's output)."""
    waveform, rate = get("audio", "waveform"), get("audio", "sample_rate")
    if waveform is None or rate is None:
        raise RuntimeError("the render has no decoded audio")
    rate = int(np.asarray(rate).reshape(-1)[0])
    started = time.perf_counter()
    samples = pcm16(waveform)
    write_wav(part(out_dir / WAV_FILE), samples, rate)
    write_m4a(part(out_dir / M4A_FILE), waveform, rate)
    m4a = publish(out_dir / M4A_FILE)
    path = publish(out_dir / WAV_FILE)
    audio = {"sample_rate": rate, "samples": int(samples.shape[0]), "seconds": round(samples.shape[0] / rate, 4)}
    assembly = {"seconds": round(time.perf_counter() - started, 3), "decode_tiles": 0}
    meta = build_metadata(spec, frames=0, fps=float(spec["frame_rate"]), audio=audio, assembly=assembly,
                          runs=runs or [], outputs={"wav": str(path), "m4a": str(m4a)})
    write_metadata(part(out_dir / "render.json"), meta)
    publish(out_dir / "render.json")
    return path
