"""What an untrusted media file must be before anything decodes it: limits, the probe's record and the
rules over it. Pure (no PyAV, no I/O): the probe child applies them to the header before any decode,
and the coordinator reads the record they produced (`coordinator/admit/media_probe.py`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

NEEDS = ("video", "audio", "any")
# Demuxer names we take in (PyAV's `format.name` is a comma list; one part in here is enough).
CONTAINERS = frozenset({"mov", "mp4", "m4a", "matroska", "webm", "wav", "mp3", "flac", "ogg", "avi",
                        "aac", "yuv4mpegpipe"})


class MediaRefused(ValueError):
    """One line saying why a media file is refused (the file's name first)."""


@dataclass(frozen=True)
class ProbeLimits:
    max_bytes: int = 2 << 30
    max_duration_s: float = 600.0
    max_side: int = 8192
    max_pixels: int = 4096 * 4096
    max_fps: float = 240.0
    cpu_s: float = 20.0  # RLIMIT_CPU in the child, whole seconds (at least 1)
    memory_bytes: int = 2 << 30  # RLIMIT_AS in the child
    wall_s: float = 30.0  # the parent kills the child past this

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class VideoInfo:
    width: int
    height: int
    fps: float
    frames: int  # video packets demuxed
    codec: str


@dataclass(frozen=True)
class AudioInfo:
    sample_rate: int
    channels: int
    codec: str


@dataclass(frozen=True)
class MediaInfo:
    container: str
    duration_s: float
    streams: tuple[str, ...]
    video: VideoInfo | None = None
    audio: AudioInfo | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> MediaInfo:
        video = VideoInfo(**d["video"]) if d.get("video") else None
        audio = AudioInfo(**d["audio"]) if d.get("audio") else None
        return cls(str(d["container"]), float(d["duration_s"]), tuple(d["streams"]), video, audio)


def container_refusal(format_name: str) -> str | None:
    if not set(format_name.split(",")) & CONTAINERS:
        return f"container {format_name!r} is not an accepted audio/video container"
    return None


def stream_refusal(kinds: tuple[str, ...], need: str) -> str | None:
    if not {"video", "audio"} & set(kinds):
        return "has no audio or video stream"
    if need in ("video", "audio") and need not in kinds:
        return f"has no {need} stream"
    return None


def video_refusal(width: int, height: int, fps: float, limits: ProbeLimits) -> str | None:
    if width <= 0 or height <= 0:
        return f"video has no valid size ({width}x{height})"
    if max(width, height) > limits.max_side or width * height > limits.max_pixels:
        return f"video is {width}x{height}, beyond the {limits.max_side}-pixel side / {limits.max_pixels}-pixel limit"
    if not 0 < fps <= limits.max_fps:
        return f"video frame rate {fps:g} is outside (0, {limits.max_fps:g}]"
    return None


def audio_refusal(sample_rate: int, channels: int) -> str | None:
    if not 1000 <= sample_rate <= 384_000:
        return f"audio sample rate {sample_rate} Hz is outside 1000..384000"
    if not 1 <= channels <= 8:
        return f"audio has {channels} channels (1..8 accepted)"
    return None


def duration_refusal(duration_s: float | None, limits: ProbeLimits) -> str | None:
    if duration_s is None or duration_s <= 0:
        return "has no duration (truncated or a stream without length)"
    if duration_s > limits.max_duration_s:
        return f"is {duration_s:.1f} s long, longer than the {limits.max_duration_s:g} s limit"
    return None


def frame_budget(limits: ProbeLimits) -> int:
    """The most video packets a file within the limits can hold (a bomb of frames stops here)."""
    return int(limits.max_duration_s * limits.max_fps) + 16


def truncation_refusal(header_s: float, demuxed_s: float) -> str | None:
    """Data that ends well before the header's duration: a cut file."""
    if demuxed_s < 0.9 * header_s - 0.1:
        return f"is truncated: its header says {header_s:.2f} s, its data ends at {demuxed_s:.2f} s"
    return None


_RIFF_UNKNOWN = (0, 0xFFFFFFFF)  # sizes streaming writers leave when they cannot seek back


def riff_refusal(head: bytes, file_size: int, limits: ProbeLimits) -> str | None:
    """A WAV whose `data` chunk claims more than the file holds (FFmpeg quietly clips it to the file,
    so a cut or forged header would pass as a shorter clip); `head` is the file's first bytes."""
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    pos, byte_rate = 12, 0
    while pos + 8 <= len(head):
        tag, size = head[pos : pos + 4], int.from_bytes(head[pos + 4 : pos + 8], "little")
        if tag == b"fmt " and pos + 16 <= len(head):
            byte_rate = int.from_bytes(head[pos + 16 : pos + 20], "little")
        if tag == b"data":
            if size in _RIFF_UNKNOWN:
                return None
            if byte_rate and size / byte_rate > limits.max_duration_s:
                return f"claims {size / byte_rate:.1f} s of audio, longer than the {limits.max_duration_s:g} s limit"
            held = file_size - pos - 8
            return f"is truncated: its header claims {size} data bytes, the file holds {held}" if size > held else None
        pos += 8 + size + (size & 1)
    return None
