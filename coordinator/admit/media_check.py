"""A render's media held to what its pipeline needs, at submit, by the untrusted-media probe.

Each media blob the spec names (`audio_input`, `source_video`) is probed in a child process
(`coordinator.admit.media_probe`: rlimited, killed past its wall limit), never in this one; a file that is not
media, has no stream of the needed kind, is longer than the limit, or whose `--audio-start` falls
outside it is one line naming the client's file, raised as the spec refusal (exit 2 at the CLI, nothing
queued). A refused blob is named by no render, so retention removes it after its grace
(`coordinator/retention.py`). `farm render --local` runs the same check on the client's own file.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from coordinator.admit.media_probe import probe_media
from coordinator.admit.media_rules import MediaInfo, MediaRefused, ProbeLimits
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.clip_frames import clip_length, frames_at_rate
from ltx_engine.rules.ic_lora import ControlError, control_downscale
from protos.fields import SpecError

PathOf = Callable[[str], Path | None]  # a blob's file, or None when it was never uploaded


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


def check_render_media(spec: RenderPlan, path_of: PathOf, limits: ProbeLimits | None = None) -> dict:
    """Refuse, in one line, a render whose media cannot serve it; what the probe resolves for the plan
    (`source_audio`: the source clip has an audio track)."""
    audio = spec.audio_input
    if audio:
        name = audio.name or audio.blob[:12]
        path = _blob_path(audio.blob, path_of, "--audio", name)
        info = probe_named(path, "audio", "--audio", name, limits, sha=audio.blob)
        start = float(audio.start or 0.0)
        if not 0.0 <= start < info.duration_s:
            raise SpecError(
                f"--audio {name}: --audio-start {start:g} s is outside the track's {info.duration_s:.2f} s"
            )
    clip = spec.hdr_ic_lora  # the HDR IC-LoRA render's SDR clip, held as a retake's
    if clip:
        name = clip.name or clip.blob[:12]
        path = _blob_path(clip.blob, path_of, "--hdr-ic-lora", name)
        info = probe_named(path, "video", "--hdr-ic-lora", name, limits, sha=clip.blob)
        check_clip(spec, info, f"--hdr-ic-lora {name}")
    check_control_media(spec, path_of, limits)  # IC-LoRA control / Dub-It
    source = spec.source_video
    if not source:
        return {}
    flag = _clip_flag(spec) or "source video"
    name = source.name or source.blob[:12]
    path = _blob_path(source.blob, path_of, flag, name)
    info = probe_named(path, "video", flag, name, limits, sha=source.blob)
    if flag != "source video":
        check_clip(spec, info, f"{flag} {name}")
    return {"source_audio": info.audio is not None}


def check_control_media(spec: RenderPlan, path_of: PathOf, limits: ProbeLimits | None = None) -> None:
    """IC-LoRA control's clip (and its mask clip) or Dub-It's reference: a video (Dub-It's with a track) no
    shorter than the render; the IC-LoRA's header declaring the downscale the spec was planned with."""
    for key, flag in (("control_video", "--control-video"), ("control_mask", "--control-mask"),
                      ("dub_video", "--dub")):
        clip = getattr(spec, key)
        if not clip:
            continue
        name = clip.name or clip.blob[:12]
        if spec.frames is None:  # an LTX-2.5 length the duration head would pick: not for a clip
            raise SpecError(f"{flag} {name}: give -f (the render takes that many of the clip's frames)")
        info = probe_named(
            _blob_path(clip.blob, path_of, flag, name), "video", flag, name, limits, clip.blob
        )
        frames = int(spec.frames)
        if info.video is None or info.video.frames < frames:
            have = 0 if info.video is None else info.video.frames
            raise SpecError(f"{flag} {name}: {have} frames, shorter than the render's {frames}")
        if key == "dub_video" and info.audio is None:
            raise SpecError(f"--dub {name}: has no audio stream (Dub-It re-voices the clip's track)")
    lora = spec.ic_lora
    if lora:
        name = lora.name or lora.blob[:12]
        path = _blob_path(lora.blob, path_of, "--ic-lora", name)
        try:
            factor = control_downscale([path])
        except ControlError as exc:
            raise SpecError(f"--ic-lora {name}: {str(exc).removeprefix(f'{path}: ')}") from None
        if factor != int(lora.downscale):
            raise SpecError(
                f"--ic-lora {name}: its metadata's reference_downscale_factor {factor} is not the "
                f"spec's {lora.downscale}"
            )


def check_clip(spec: RenderPlan, info: MediaInfo, named: str) -> None:
    """Retake/extend: the clip holds the render's frames at the render's rate (its own rate
    converted by timestamp, `ltx_engine.rules.clip_frames`), the retake window inside it."""
    frames, fps = int(spec.frames), float(spec.frame_rate)
    held = frames_at_rate(info.video.frames, info.video.fps, fps)
    if held < frames:
        at = "" if abs(info.video.fps - fps) < 0.01 else f" at {info.video.fps:g} fps ({held} at {fps:g})"
        raise SpecError(f"{named}: {info.video.frames} frames{at}, fewer than the render's {frames} (-f)")
    window = spec.retake
    if window and float(window.end) > info.duration_s + 1e-6:
        raise SpecError(
            f"{named}: --end {float(window.end):g} s is past the clip's {info.duration_s:.2f} s"
        )
    if spec.extend and spec.audio and info.audio is None:
        raise SpecError(f"{named}: the clip has no audio track to continue; give --no-audio")


def clip_frames(spec: RenderPlan, path_of: PathOf, limits: ProbeLimits | None = None) -> dict:
    """-f left out on a retake / extend: the whole clip at the render's rate, rounded down to 8k + 1
    (`{"frames": N}`, resolved before the spec is checked, so the DurationHead never picks it); {}
    otherwise. Probed as `check_render_media` probes it (the same cached child)."""
    source, kind = spec.source_video, _clip_flag(spec)
    if spec.frames is not None or not source or kind is None:
        return {}
    name = source.name or source.blob[:12]
    path = _blob_path(source.blob, path_of, kind, name)
    video = probe_named(path, "video", kind, name, limits, sha=source.blob).video
    return {"frames": clip_length(video.frames, video.fps, float(spec.frame_rate))}


def _clip_flag(spec: RenderPlan) -> str | None:
    """The flag of the clip recipe a source video serves (retake or extend), None for a plain source."""
    return "--retake" if spec.retake else "--extend" if spec.extend else None


def store_paths(blobs) -> PathOf:
    """The blob store's file of a sha, None when it holds none."""
    return lambda sha: blobs.path(sha) if blobs.has(sha) else None
