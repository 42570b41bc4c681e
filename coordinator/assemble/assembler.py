"""The assembler: a finished render's task outputs become render.mp4 (+ EXR frames) and render.json
(a T2A render's: render.wav, `audio_file.py`).

The farm's scheduler and `farm render --local` both call `assemble_streaming` with a getter for task
outputs, so both write the same frames. A tiled decode is blended here (blend_frames, strict tile
order) one frame at a time from frame slices of the tiles, and every finished frame goes straight to
the encoder, so assembly holds one frame and its sums, not a window (the coordinator's getter hands
out decode tiles as blob-backed readers). Encoder settings are fixed so the same outputs always give the same file.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import OpenEXR

from coordinator.assemble.audio_file import AUDIO_CODEC, assemble_audio, encode_waveform
from coordinator.assemble.chunk_frames import joined_frames
from coordinator.assemble.hdr_master import (
    HDR_EXR_DEFAULT,
    HLG_FILE,
    HlgMasterWriter,
    hdr_frame,
    hdr_transfer,
)
from coordinator.assemble.previews import PreviewWriter, to_uint8
from coordinator.assemble.render_meta import PeakMemory, build_metadata, write_metadata
from coordinator.plan.chunks import chunked
from coordinator.plan.decode import DECODE, decode_tile_plan, tile_task_name
from coordinator.plan.recipes import recipe_for
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules import color
from ltx_engine.rules.decode_tiling import TileFrames, blend_frames, frame_bytes

VIDEO_CODEC = "libx264"
F32 = np.float32

# (task name within the render, e.g. "decode.t3", output name) → the array, or None when absent.
OutputGetter = Callable[[str, str], "np.ndarray | None"]
# Called before each finished file takes its place; raises to keep it out (the farm: NotLeader once
# another coordinator leads, so an old leader that woke up never overwrites the new one's files).
Fence = Callable[[], None]


class Staged:
    """Files written under a hidden name of this assembly's own and moved into place (os.replace) only
    once `fence` passes: a file is either this assembly's whole file or untouched."""

    def __init__(self, fence: Fence | None) -> None:
        self.fence, self._tag = fence, secrets.token_hex(4)

    def part(self, path: Path) -> Path:
        return path.with_name(f".{self._tag}.{path.name}")

    def publish(self, path: Path) -> Path:
        if self.fence is not None:
            self.fence()
        os.replace(self.part(path), path)
        return path


srgb_to_linear = color.srgb_eotf  # display-referred [0, 1] → linear light, what EXR consumers expect


def write_exr(path: Path, frame: np.ndarray, colorspace: str = color.EXR_COLORSPACES[0],
              values: np.ndarray | None = None) -> None:
    """One (H, W, 3) [0, 1] sRGB frame as a half-float RGB EXR (ZIP, scanlines) in `colorspace`
    (`--exr-colorspace`: srgb-linear, acescg or acescct; ltx_engine/rules/color.py), its primaries in the
    chromaticities header and upstream's colorSpace tag beside them. `values`: the frame's EXR values
    already in `colorspace` (an HDR IC-LoRA render's, `hdr_master.hdr_frame`)."""
    values = (color.sdr_to_exr(frame, colorspace) if values is None else values).astype(np.float16)
    channels = {name: np.ascontiguousarray(values[..., i]) for i, name in enumerate("RGB")}
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage,
              "chromaticities": color.exr_primaries(colorspace).chromaticities(),
              "colorSpace": color.EXR_TAGS[colorspace]}
    with OpenEXR.File(header, channels) as exr:
        exr.write(str(path))


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
        if self._audio is not None:
            encode_waveform(self._container, self._audio, waveform, sample_rate)

    def close(self) -> None:
        for packet in self._video.encode():
            self._container.mux(packet)
        if self._audio is not None:
            for packet in self._audio.encode():
                self._container.mux(packet)
        self._container.close()


class SideOutputs:
    """A frame's files beside the mp4: EXR frames in their colourspace (`--exr-colorspace`) and the HLG
    master (`--hdr`, render_hlg.mp4 in the render's folder), each staged and published like the mp4."""

    def __init__(self, spec: dict, staged: Staged, out_dir: Path, exr_dir: Path | None, fps: float) -> None:
        self.staged, self.exr_dir = staged, exr_dir
        self.hdr = hdr_transfer(spec)  # an HDR IC-LoRA render's frames are working codes
        self.colorspace = spec.get("exr_colorspace") or (HDR_EXR_DEFAULT if self.hdr else color.EXR_COLORSPACES[0])
        self.hlg_path = out_dir / HLG_FILE if spec.get("hdr") else None
        self.hlg = None if self.hlg_path is None else HlgMasterWriter(
            staged.part(self.hlg_path), width=spec["width"], height=spec["height"], fps=fps)

    def add(self, index: int, frame: np.ndarray) -> None:
        out = hdr_frame(frame, self.hdr, self.colorspace) if self.hdr else None
        if self.hlg is not None:
            self.hlg.write_linear(color.srgb_eotf(frame) if out is None else out["linear_709"])
        if self.exr_dir is not None:
            path = self.exr_dir / f"frame_{index:05d}.exr"
            write_exr(self.staged.part(path), frame, self.colorspace, None if out is None else out["exr"])
            self.staged.publish(path)

    def close(self) -> None:
        if self.hlg is not None:
            self.hlg.close()

    def publish(self) -> None:
        if self.hlg_path is not None:
            self.staged.publish(self.hlg_path)


def fit_audio(waveform: np.ndarray, sample_rate: int, frames: int, fps: float) -> np.ndarray:
    """Trim or zero-pad the waveform to the video's duration, so the streams end together."""
    wave = np.asarray(waveform, dtype=np.float32)
    wave = wave[None] if wave.ndim == 1 else wave
    want = round(frames / fps * sample_rate)
    if wave.shape[1] >= want:
        return wave[:, :want]
    return np.concatenate([wave, np.zeros((wave.shape[0], want - wave.shape[1]), np.float32)], axis=1)


def tile_frames(tiles: list, get_pixels: Callable[[int], TileFrames | None]) -> Iterator[np.ndarray]:
    """Blend decode tiles strictly in tile order; yield each finished frame (H, W, 3) in [0, 1].

    Tiles carry raw decoder pixels (1, 3, f, h, w); the [0, 1] mapping follows the blend, as the
    reference's tiled decode does. Each frame is built from frame slices of the tiles that cover it
    (blend_frames): a blob-backed tile is read a frame at a time, never whole.
    """
    for _, frame in blend_frames(tiles, get_pixels, 1, 3):
        yield np.clip((frame[0] + F32(1.0)) / F32(2.0), F32(0.0), F32(1.0)).transpose(1, 2, 0)


def video_frames(spec: dict, get: OutputGetter) -> tuple[Iterator[np.ndarray], dict]:
    """The render's frames in order (streamed when tiled) and what the metadata says about the decode:
    window_bytes counts everything the blend holds at once (accumulator, weights, tile slices). A chunked
    render's windows are joined (assemble/chunk_frames.py)."""
    plan = RenderPlan.from_stored(spec)  # the stored view, typed where it enters
    if chunked(plan):
        return joined_frames(plan, lambda view, prefix: decoded_frames(view, get, prefix))
    return decoded_frames(plan, get)


def decoded_frames(plan: RenderPlan, get: OutputGetter, prefix: str = "") -> tuple[Iterator[np.ndarray], dict]:
    """One decode's frames (its tasks named `prefix` + decode …)."""
    tiles = decode_tile_plan(plan)
    if tiles is None:
        video = get(prefix + DECODE, "frames")
        if video is None:
            raise RuntimeError("the render has no decoded frames")
        return (video[i] for i in range(video.shape[0])), {"decode_tiles": 1, "window_frames": int(video.shape[0]),
                                                           "window_bytes": int(video.nbytes)}
    frames = tile_frames(tiles, lambda i: get(prefix + tile_task_name(i), "pixels"))
    return frames, {"decode_tiles": len(tiles), "window_frames": 1, "window_bytes": frame_bytes(tiles)}


def assemble_streaming(spec: dict, get: OutputGetter, out_dir: Path, runs: list[dict] | None = None,
                       preview: Path | None = None, exr_dir: Path | None = None, fence: Fence | None = None) -> Path:
    """Write render.mp4 (+ EXR frames into exr_dir when given) and render.json next to each; returns the
    mp4. The caller names exr_dir: the coordinator its render folder's exr/, `--local` the user's folder;
    spec["exr"] is never opened as a path here (on the farm it came from a client).

    get: task outputs by (task name, output name); runs: per-task records (name, kind, worker,
    start_ms, end_ms, seconds) for the metadata's per-stage timings; preview: where the dashboard's
    thumbnail of the latest finished frame goes (and its contact strip beside it); fence: checked before
    each file is published (Staged).
    """
    staged = Staged(fence)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not recipe_for(RenderPlan.from_stored(spec)).video:  # T2A: the waveform alone, as a WAV (assemble/audio_file.py)
        return assemble_audio(spec, get, out_dir, runs, staged.part, staged.publish)
    if exr_dir is not None:
        exr_dir = Path(exr_dir)
        exr_dir.mkdir(parents=True, exist_ok=True)
    height, width = spec["height"], spec["width"]
    fps = float(spec.get("output_fps") or spec["frame_rate"])
    waveform, rate = get("audio", "waveform"), get("audio", "sample_rate")
    rate = int(rate.reshape(-1)[0]) if waveform is not None and rate is not None else None
    started = time.perf_counter()
    with PeakMemory() as memory:
        frames, decode_info = video_frames(spec, get)
        writer = Mp4Writer(staged.part(out_dir / "render.mp4"), width=width, height=height, fps=fps, audio_rate=rate)
        thumbs = PreviewWriter(preview, int(spec.get("output_frames") or spec["frames"])) if preview else None
        sides = SideOutputs(spec, staged, out_dir, exr_dir, fps)
        try:
            for index, frame in enumerate(frames):
                writer.write_frame(frame)
                if thumbs is not None:
                    thumbs.add(frame)
                sides.add(index, frame)
            if waveform is not None and rate:
                waveform = fit_audio(waveform, rate, writer.frames_written, fps)
                writer.write_audio(waveform, rate)
        finally:
            writer.close()
            if thumbs is not None:
                thumbs.close()
            sides.close()
        mp4 = staged.publish(out_dir / "render.mp4")
        sides.publish()
    assembly = {"seconds": round(time.perf_counter() - started, 3), "peak_traced_bytes": memory.peak,
                "window_bytes": decode_info["window_bytes"],
                "clip_bytes": writer.frames_written * height * width * 3 * 4, **decode_info}
    audio = None if waveform is None else {"sample_rate": rate, "samples": int(waveform.shape[-1]),
                                           "seconds": round(waveform.shape[-1] / rate, 4)}
    outputs = {"mp4": str(mp4), "exr_dir": str(exr_dir) if exr_dir else None,
               "exr_frames": writer.frames_written if exr_dir else 0,
               "hlg_mp4": str(sides.hlg_path) if sides.hlg_path else None}
    meta = build_metadata(spec, frames=writer.frames_written, fps=fps, audio=audio, assembly=assembly,
                          runs=runs or [], outputs=outputs)
    for folder in (out_dir, exr_dir) if exr_dir is not None else (out_dir,):
        write_metadata(staged.part(folder / "render.json"), meta)
        staged.publish(folder / "render.json")
    return mp4
