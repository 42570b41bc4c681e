"""A render's media held to what its pipeline needs, at submit (issue #24), by the untrusted-media probe.

Each media blob the spec names (`audio_input`, `source_video`) is probed in a child process
(`coordinator.media_probe`: rlimited, killed past its wall limit), never in this one; a file that is not
media, has no stream of the needed kind, is longer than the limit, or whose `--audio-start` falls
outside it is one line naming the client's file, raised as the spec refusal (exit 2 at the CLI, nothing
queued). A refused blob is named by no render, so retention removes it after its grace
(`coordinator/retention.py`). `farm render --local` runs the same check on the client's own file.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path

from coordinator.media_probe import probe_media
from coordinator.media_rules import MediaInfo, MediaRefused, ProbeLimits
from protos.fields import SpecError

PathOf = Callable[[str], Path | None]  # a blob's file, or None when it was never uploaded


def _field(spec: Mapping, key: str) -> dict | None:
    value = spec.get(key)
    return value.to_dict() if hasattr(value, "to_dict") else value


@functools.lru_cache(maxsize=256)
def _probe_blob(sha: str, path: Path, need: str, limits: ProbeLimits | None) -> MediaInfo:
    """A blob's probe, once per sha (its content cannot change): a seed sweep of one track probes it once.
    Refusals are not kept (an exception is not cached)."""
    return probe_media(path, need, limits)


def probe_named(
    path: Path, need: str, flag: str, name: str, limits: ProbeLimits | None = None, sha: str | None = None
) -> MediaInfo:
    """MediaInfo of `path` (the blob `sha`, when given), or SpecError("<flag> <name>: <what is wrong>")."""
    try:
        return _probe_blob(sha, path, need, limits) if sha else probe_media(path, need, limits)
    except MediaRefused as exc:
        reason = str(exc).removeprefix(f"{path.name}: ")
        raise SpecError(f"{flag} {name}: {reason}") from None


def _blob_path(blob: str, path_of: PathOf, flag: str, name: str) -> Path:
    path = path_of(blob)
    if path is None:
        raise SpecError(f"{flag} {name}: its blob {blob[:12]} was never uploaded")
    return path


def check_render_media(spec: Mapping, path_of: PathOf, limits: ProbeLimits | None = None) -> None:
    """Refuse, in one line, a render whose media cannot serve it."""
    audio = _field(spec, "audio_input")
    if audio:
        name = audio.get("name") or audio["blob"][:12]
        path = _blob_path(audio["blob"], path_of, "--audio", name)
        info = probe_named(path, "audio", "--audio", name, limits, sha=audio["blob"])
        start = float(audio.get("start") or 0.0)
        if not 0.0 <= start < info.duration_s:
            raise SpecError(
                f"--audio {name}: --audio-start {start:g} s is outside the track's {info.duration_s:.2f} s"
            )
    source = _field(spec, "source_video")
    if source:
        name = source.get("name") or source["blob"][:12]
        path = _blob_path(source["blob"], path_of, "source video", name)
        probe_named(path, "video", "source video", name, limits, sha=source["blob"])
    clip = _field(spec, "hdr_ic_lora")  # issue #29: the HDR IC-LoRA render's SDR clip
    if clip:
        name = clip.get("name") or clip["blob"][:12]
        path = _blob_path(clip["blob"], path_of, "--hdr-ic-lora", name)
        info = probe_named(path, "video", "--hdr-ic-lora", name, limits, sha=clip["blob"])
        have = info.video.frames if info.video else 0
        if spec.get("frames") and have < int(spec["frames"]):
            raise SpecError(
                f"--hdr-ic-lora {name}: the clip has {have} frames, the render asks -f {spec['frames']}"
            )


def store_paths(blobs) -> PathOf:
    """The blob store's file of a sha, None when it holds none."""
    return lambda sha: blobs.path(sha) if blobs.has(sha) else None
