"""The assembler: turns a render's products (decoded frames, audio waveform) into an mp4 (+ metadata).

Frames arrive as float arrays in [0, 1] (F, H, W, 3); they are streamed into H.264 one by one so the
writer never needs the whole clip at once. Audio is AAC. Settings are fixed so the same products
always give the same file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

VIDEO_CODEC = "libx264"
AUDIO_CODEC = "aac"


def to_uint8(frame: np.ndarray) -> np.ndarray:
    """[0, 1] float pixels to uint8 with rounding; the one conversion every output path uses."""
    return np.clip(np.rint(np.asarray(frame, dtype=np.float32) * 255.0), 0, 255).astype(np.uint8)


class Mp4Writer:
    """Streams frames (and, at the end, audio) into an mp4 file."""

    def __init__(self, path: Path, *, width: int, height: int, fps: float, audio_rate: int | None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._container = av.open(str(self.path), mode="w", format="mp4")
        rate = Fraction(fps).limit_denominator(1001)
        self._video = self._container.add_stream(VIDEO_CODEC, rate=rate)
        self._video.width, self._video.height = width, height
        self._video.pix_fmt = "yuv420p"
        self._video.options = {"crf": "18", "preset": "medium", "threads": "1"}
        self._audio = None
        if audio_rate:
            self._audio = self._container.add_stream(AUDIO_CODEC, rate=audio_rate)
            self._audio.layout = "stereo"
        self.frames_written = 0

    def write_frame(self, frame: np.ndarray) -> None:
        image = to_uint8(frame) if frame.dtype != np.uint8 else frame
        video_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
        for packet in self._video.encode(video_frame):
            self._container.mux(packet)
        self.frames_written += 1

    def write_audio(self, waveform: np.ndarray, sample_rate: int) -> None:
        """waveform (channels, samples) float in [-1, 1]; mono is duplicated to stereo."""
        if self._audio is None:
            return
        wave = np.asarray(waveform, dtype=np.float32)
        if wave.ndim == 1:
            wave = wave[None]
        if wave.shape[0] == 1:
            wave = np.concatenate([wave, wave], axis=0)
        wave = np.clip(wave[:2], -1.0, 1.0)
        frame_size = self._audio.codec_context.frame_size or 1024
        for start in range(0, wave.shape[1], frame_size):
            chunk = np.ascontiguousarray(wave[:, start : start + frame_size])
            audio_frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="stereo")
            audio_frame.sample_rate = sample_rate
            audio_frame.pts = start
            for packet in self._audio.encode(audio_frame):
                self._container.mux(packet)

    def close(self) -> None:
        for packet in self._video.encode():
            self._container.mux(packet)
        if self._audio is not None:
            for packet in self._audio.encode():
                self._container.mux(packet)
        self._container.close()


def write_mp4(
    path: Path,
    frames: Iterable[np.ndarray],
    *,
    width: int,
    height: int,
    fps: float,
    waveform: np.ndarray | None = None,
    sample_rate: int | None = None,
) -> Path:
    """Write frames (+ optional audio) to `path`; returns the path."""
    writer = Mp4Writer(path, width=width, height=height, fps=fps, audio_rate=sample_rate if waveform is not None else None)
    try:
        for frame in frames:
            writer.write_frame(frame)
        if waveform is not None and sample_rate:
            writer.write_audio(waveform, sample_rate)
    finally:
        writer.close()
    return Path(path)


def assemble(spec: dict, products: dict[str, np.ndarray], out_dir: Path) -> Path:
    """Write `render.mp4` and `render.json` into out_dir from the render's products.

    products: "video" (F, H, W, 3) float in [0, 1]; optional "audio" (channels, samples) float32
    with "audio_rate" (a 1-element array) giving its sample rate.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    video = products["video"]
    frames, height, width = video.shape[0], video.shape[1], video.shape[2]
    waveform = products.get("audio")
    rate = int(products["audio_rate"].reshape(-1)[0]) if waveform is not None else None
    fps = float(spec.get("output_fps") or spec["frame_rate"])
    path = write_mp4(out_dir / "render.mp4", (video[i] for i in range(frames)), width=width, height=height,
                     fps=fps, waveform=waveform, sample_rate=rate)
    meta = {"spec": spec, "frames": int(frames), "width": int(width), "height": int(height), "fps": fps,
            "audio_sample_rate": rate}
    (out_dir / "render.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return path
