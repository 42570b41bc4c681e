"""The media probe's child process: `python -m coordinator.admit.media_probe_child PATH NEED LIMITS_JSON`.

It caps its own address space and CPU time (resource.setrlimit) before PyAV is imported, checks the
container and the header against `coordinator.admit.media_rules` before anything is decoded, demuxes the
needed stream's packets (bounded by the frame budget) to catch a cut or padded file, decodes what the
workers will (the first video frame to RGB, the audio track as the audio encoder reads it), and prints
one JSON line: {"ok": MediaInfo} or {"refused": reason}. Everything else (a crash, a signal, a blown
limit) the parent reads from the exit status.
"""

from __future__ import annotations

import json
import math
import resource
import sys

from coordinator.admit import media_rules as rules


def _limit(limits: rules.ProbeLimits) -> None:
    cpu = max(1, math.ceil(limits.cpu_s))  # RLIMIT_CPU counts whole seconds
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class _Refused(Exception):
    pass


def _check(reason: str | None) -> None:
    if reason is not None:
        raise _Refused(reason)


def _header(container, need: str, limits: rules.ProbeLimits) -> dict:
    """The container's own claims, refused on the rules before any packet is read."""
    _check(rules.container_refusal(container.format.name))
    kinds = tuple(s.type for s in container.streams)
    _check(rules.stream_refusal(kinds, need))
    video = container.streams.video[0] if container.streams.video else None
    audio = container.streams.audio[0] if container.streams.audio else None
    facts: dict = {"container": container.format.name, "streams": kinds, "video": None, "audio": None}
    for kind, stream in (("video", video), ("audio", audio)):
        if stream is not None and stream.codec_context is None:
            raise _Refused(f"is damaged: its {kind} stream names no codec FFmpeg can read")
    if video is not None:
        fps = float(video.average_rate or video.base_rate or 0)
        _check(rules.video_refusal(video.codec_context.width, video.codec_context.height, fps, limits))
        facts["video"] = {"width": video.codec_context.width, "height": video.codec_context.height,
                          "fps": fps, "frames": 0, "codec": video.codec_context.name}
    if audio is not None:
        _check(rules.audio_refusal(audio.codec_context.sample_rate, audio.codec_context.channels))
        facts["audio"] = {"sample_rate": audio.codec_context.sample_rate,
                          "channels": audio.codec_context.channels, "codec": audio.codec_context.name}
    duration = container.duration / 1_000_000 if container.duration else None
    _check(rules.duration_refusal(duration, limits))
    facts["duration_s"] = duration
    return facts


def _scan(container, facts: dict, limits: rules.ProbeLimits) -> None:
    """Demux every packet of the first video (else audio) stream: count frames, find where data ends."""
    stream = container.streams.video[0] if facts["video"] else container.streams.audio[0]
    budget, count, end = rules.frame_budget(limits), 0, 0.0
    for packet in container.demux(stream):
        if packet.size == 0 or packet.pts is None:
            continue
        count += 1
        if count > budget:
            raise _Refused(f"holds more than {budget} frames")
        end = max(end, float((packet.pts + (packet.duration or 0)) * packet.time_base))
    if stream.start_time is not None:
        end -= float(stream.start_time * stream.time_base)
    _check(rules.truncation_refusal(facts["duration_s"], end))
    if facts["video"]:
        facts["video"]["frames"] = count


def _decode_as_workers(av, path: str, facts: dict) -> None:
    """Decode what the workers will: the first video frame as the RGB pixels they take, and the whole
    audio track as the audio encoder's window decode reads it (a file that passes the header and
    the demux can still fail there, on every worker)."""
    if facts["video"] is not None:
        with av.open(path) as container:
            frame = next(container.decode(video=0), None)
            if frame is None:
                raise _Refused("has no decodable video frame")
            frame.to_ndarray(format="rgb24")
    if facts["audio"] is not None:
        from ltx_engine.rules.audio_source import decode_window

        with open(path, "rb") as f:
            raw = f.read()
        try:
            decode_window(raw, 0.0, facts["duration_s"] or 1.0)
        except ValueError as exc:
            raise _Refused(f"has no decodable audio ({exc})") from exc


def _riff(path: str, limits: rules.ProbeLimits) -> None:
    with open(path, "rb") as f:
        head = f.read(4096)
        size = f.seek(0, 2)
    _check(rules.riff_refusal(head, size, limits))


def probe(path: str, need: str, limits: rules.ProbeLimits) -> dict:
    import av

    try:
        _riff(path, limits)
        with av.open(path, metadata_errors="ignore") as container:
            facts = _header(container, need, limits)
            _scan(container, facts, limits)
        _decode_as_workers(av, path, facts)
    except _Refused as exc:
        return {"refused": str(exc)}
    except av.error.FFmpegError as exc:
        return {"refused": f"is not a readable audio/video file ({exc.strerror or type(exc).__name__})"}
    except MemoryError:
        return {"refused": "needs more memory than the probe allows"}
    except (AttributeError, TypeError, ValueError, ZeroDivisionError, IndexError) as exc:  # PyAV on a damaged file
        return {"refused": f"is damaged: FFmpeg read it into nonsense ({type(exc).__name__}: {exc})"}
    return {"ok": facts}


def main(argv: list[str]) -> int:
    path, need, raw = argv
    limits = rules.ProbeLimits(**json.loads(raw))
    _limit(limits)
    print(json.dumps(probe(path, need, limits)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
