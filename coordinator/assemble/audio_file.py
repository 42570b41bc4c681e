"""An audio-only render's file (`--pipeline t2a`): the decoded waveform as a WAV, and its render.json.

Upstream's `encode_audio` writes T2A's waveform as 16-bit PCM stereo WAV at the vocoder's rate: clipped
to [-1, 1], times 32767, truncated toward zero (torch's cast to int16). The same rule is written here
with Python's `wave` (no encoder in the way), so the same waveform always gives the same bytes on the
farm and with `--local`. The whole waveform is written: there is no video for it to end with.
"""

from __future__ import annotations

import time
import wave
from collections.abc import Callable
from pathlib import Path

import numpy as np

from coordinator.assemble.render_meta import build_metadata, write_metadata

WAV_FILE = "render.wav"


def pcm16(waveform: np.ndarray) -> np.ndarray:
    """(channels, samples) float → (samples, 2) int16 as upstream scales it; mono is duplicated."""
    wave_f = np.asarray(waveform, dtype=np.float32)
    wave_f = wave_f[None] if wave_f.ndim == 1 else wave_f
    if wave_f.shape[0] == 1:
        wave_f = np.concatenate([wave_f, wave_f], axis=0)
    scaled = np.clip(wave_f[:2], np.float32(-1.0), np.float32(1.0)) * np.float32(32767.0)
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
    """Write render.wav and render.json into out_dir (each staged by `part`, moved into place by
    `publish`, as the assembler stages its mp4); returns the wav."""
    waveform, rate = get("audio", "waveform"), get("audio", "sample_rate")
    if waveform is None or rate is None:
        raise RuntimeError("the render has no decoded audio")
    rate = int(np.asarray(rate).reshape(-1)[0])
    started = time.perf_counter()
    samples = pcm16(waveform)
    write_wav(part(out_dir / WAV_FILE), samples, rate)
    path = publish(out_dir / WAV_FILE)
    audio = {"sample_rate": rate, "samples": int(samples.shape[0]), "seconds": round(samples.shape[0] / rate, 4)}
    assembly = {"seconds": round(time.perf_counter() - started, 3), "decode_tiles": 0}
    meta = build_metadata(spec, frames=0, fps=float(spec["frame_rate"]), audio=audio, assembly=assembly,
                          runs=runs or [], outputs={"wav": str(path)})
    write_metadata(part(out_dir / "render.json"), meta)
    publish(out_dir / "render.json")
    return path
