"""The untrusted-media probe: real files written by PyAV here, bad ones cut or crafted by hand, every
probe in a real child process with real limits. Each refusal is one line naming the file, and this
process (the parent, as the coordinator would be) keeps going."""

from __future__ import annotations

import os
import struct
import wave
import zipfile
from pathlib import Path

import av  # a dependency of the project (the worker's media): imported plainly, never skipped
import numpy as np
import pytest

from coordinator.admit.media_probe import probe_media
from coordinator.admit.media_rules import MediaInfo, MediaRefused, ProbeLimits

pytestmark = pytest.mark.timeout(60)


def _write_mp4(path: Path, seconds: float = 1.0, fps: int = 24, audio: bool = True, faststart: bool = False) -> Path:
    with av.open(str(path), "w", options={"movflags": "faststart"} if faststart else {}) as out:
        video = out.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        sound = out.add_stream("aac", rate=16000) if audio else None
        if sound is not None:
            sound.layout = "stereo"
        for i in range(int(seconds * fps)):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i * 7 % 255, np.uint8), format="rgb24")
            out.mux(video.encode(frame))
        out.mux(video.encode())
        if sound is not None:
            samples = int(seconds * 16000)
            for start in range(0, samples, 1024):
                chunk = (0.1 * np.sin(np.arange(start, min(samples, start + 1024)) / 9)).astype(np.float32)
                frame = av.AudioFrame.from_ndarray(np.stack([chunk, chunk]), format="fltp", layout="stereo")
                frame.sample_rate, frame.pts = 16000, start
                out.mux(sound.encode(frame))
            out.mux(sound.encode())
    return path


def _write_wav(path: Path, seconds: float, rate: int = 16000) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.zeros(int(seconds * rate), np.int16).tobytes())
    return path


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return _write_mp4(tmp_path_factory.mktemp("media") / "clip.mp4")


def _refused(path: Path, need: str = "any", limits: ProbeLimits | None = None) -> str:
    with pytest.raises(MediaRefused) as err:
        probe_media(path, need, limits)
    line = str(err.value)
    assert line.startswith(f"{path.name}: ") and "\n" not in line
    return line


def test_mp4_with_audio_gives_the_typed_record(clip):
    info = probe_media(clip, "video")
    assert info.streams == ("video", "audio")
    assert "mp4" in info.container and info.duration_s == pytest.approx(1.0, abs=0.1)
    assert (info.video.width, info.video.height, info.video.fps, info.video.frames) == (64, 48, 24.0, 24)
    assert (info.audio.sample_rate, info.audio.channels, info.audio.codec) == (16000, 2, "aac")
    assert probe_media(clip, "audio") == info
    assert MediaInfo.from_dict(info.to_dict()) == info


def test_wav_is_audio_only(tmp_path):
    path = _write_wav(tmp_path / "voice.wav", 0.5)
    info = probe_media(path, "audio")
    assert info.container == "wav" and info.video is None
    assert (info.audio.sample_rate, info.audio.channels) == (16000, 1)
    assert info.duration_s == pytest.approx(0.5, abs=0.01)
    assert _refused(path, "video").endswith("has no video stream")


def test_video_without_audio_refused_for_audio(tmp_path):
    path = _write_mp4(tmp_path / "mute.mp4", 0.5, audio=False)
    assert _refused(path, "audio").endswith("has no audio stream")


def test_truncated_mp4(clip, tmp_path):
    data = clip.read_bytes()
    for keep in (len(data) // 2, len(data) - 200, 64):
        cut = tmp_path / f"cut{keep}.mp4"
        cut.write_bytes(data[:keep])
        assert "not a readable" in _refused(cut) or "truncated" in _refused(cut)


def test_truncated_faststart_mp4_refused_against_its_header(tmp_path):
    whole = _write_mp4(tmp_path / "whole.mp4", 2.0, faststart=True)  # index first: a cut file still opens
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    assert "is truncated: its header says 2.00 s" in _refused(cut, "video")


def test_truncated_wav_refused_against_its_header(tmp_path):
    path = _write_wav(tmp_path / "whole.wav", 2.0)
    cut = tmp_path / "cut.wav"
    cut.write_bytes(path.read_bytes()[: 44 + 16000])  # 0.5 s of the 2 s its header promises
    assert "truncated" in _refused(cut, "audio")


@pytest.mark.parametrize("kind", ["random", "zip", "text"])
def test_wrong_container(tmp_path, kind):
    path = tmp_path / f"upload.{kind}"
    if kind == "random":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8).tobytes())
    elif kind == "zip":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("frames.bin", b"\0" * 1_000_000)
    else:
        path.write_text("not a video\n" * 100)
    line = _refused(path)
    assert "not a readable" in line or "not an accepted" in line or "no audio or video" in line


def test_absurd_dimensions_refused_before_decoding(tmp_path):
    path = tmp_path / "huge.y4m"  # a raw-video header claiming 10000x10000, one frame's worth of nothing
    path.write_bytes(b"YUV4MPEG2 W10000 H10000 F24:1 Ip A1:1 C420jpeg\nFRAME\n" + b"\0" * 1000)
    assert "10000x10000, beyond" in _refused(path, "video")


def test_absurd_header_duration(tmp_path):
    path = tmp_path / "forever.wav"  # a data chunk claiming ~37 hours at 16 kHz mono 16-bit
    header = b"RIFF" + struct.pack("<I", 0xFFFFFFF0) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16)
    path.write_bytes(header + b"data" + struct.pack("<I", 0xFFFFFFE0) + b"\0" * 32000)
    line = _refused(path, "audio")
    assert "longer than" in line or "truncated" in line


def test_longer_than_the_limit(clip, tmp_path):
    path = _write_wav(tmp_path / "long.wav", 3.0)  # refused on its RIFF header, before FFmpeg reads it
    assert "claims 3.0 s of audio, longer than the 2 s limit" in _refused(path, "audio", ProbeLimits(max_duration_s=2.0))
    assert "is 1.0 s long, longer than the 0.5 s limit" in _refused(clip, "video", ProbeLimits(max_duration_s=0.5))


def test_a_probe_that_takes_too_long_is_killed(clip):
    assert "took longer than 0.01 s" in _refused(clip, "video", ProbeLimits(wall_s=0.01))


def test_a_probe_out_of_memory_is_refused(clip):
    assert _refused(clip, "video", ProbeLimits(memory_bytes=64 << 20)).endswith("probe ran out of memory")


def test_size_limit_refused_without_a_child(clip, tmp_path):
    assert "outside 1..1000" in _refused(clip, "video", ProbeLimits(max_bytes=1000))
    empty = tmp_path / "empty.mp4"
    empty.touch()
    assert "0 bytes" in _refused(empty)


def test_the_parent_survives_every_refusal(clip, tmp_path):
    pid = os.getpid()
    for name, blob in (("a.mp4", clip.read_bytes()[:300]), ("b.bin", os.urandom(5000)), ("c.wav", b"RIFF")):
        (tmp_path / name).write_bytes(blob)
        _refused(tmp_path / name)
    assert os.getpid() == pid
    assert probe_media(clip, "video").video.frames == 24


def _bit_flipped(clip: Path, to: Path, seed: int) -> Path:
    """The clip with three bits flipped where Random(seed) says (a damaged download or disk)."""
    import random

    rng, data = random.Random(seed), bytearray(clip.read_bytes())
    for _ in range(3):
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    to.write_bytes(data)
    return to


def test_a_bit_flip_that_loses_the_codec_is_named_not_shown_as_a_probe_crash(clip, tmp_path):
    why = _refused(_bit_flipped(clip, tmp_path / "flipped.mp4", 19))
    assert "damaged" in why and "probe failed" not in why and "Error" not in why, why


def test_a_file_whose_audio_the_workers_cannot_decode_is_refused(clip, tmp_path):
    """Header and demux fine, the first frames decode: the audio track as the workers read it does not."""
    from ltx_engine.rules.audio_source import decode_window

    damaged = _bit_flipped(clip, tmp_path / "flipped.mp4", 0)
    with pytest.raises(av.error.FFmpegError):  # what every worker's audio decode would meet
        decode_window(damaged.read_bytes(), 0.0, 1.0)
    assert "has no decodable audio" in _refused(damaged)
