"""The assembler: a finished render's task outputs become render.mp4 (+ EXR frames) and render.json
(a T2A render's: render.wav, `audio_file.py`).

The farm's scheduler and `farm render --local` both call `assemble_streaming` with a getter for task
outputs, so both write the same frames; the farm's early encode (`early.py`) writes them through the
same `VideoAssembly` while the decode still runs, the same bytes. A tiled decode is blended here (blend_frames, strict tile
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
AUDIO_LATER = -1  # Mp4Writer's audio_rate when the track is decided after the first frames (open_audio)

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

    def __init__(self, path: Path, *, width: int, height: int, fps: float, audio_rate: int | None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._container = av.open(str(self.path), mode="w", format="mp4")
        rate = Fraction(fps).limit_denominator(1001)
        self._video = self._container.add_stream(VIDEO_CODEC, rate=rate)
        self._video.width, self._video.height = width, height
        self._video.pix_fmt = "yuv420p"
        self._video.options = {"crf": "18", "preset": "medium", "threads": "1"}
        self._audio = None
        self._held: list | None = []  # video packets held until the audio track is decided
        self._tail: list | None = None  # the encoder's flush, once `end_video` ran it
        self.frames_written = 0
        if audio_rate != AUDIO_LATER:
            self.open_audio(audio_rate)

    @property
    def audio_pending(self) -> bool:
        return self._held is not None

    def open_audio(self, audio_rate: int | None) -> None:
        """Decide the audio track (None: none) and mux the video packets held until now. The container's
        header is written at its first mux, so a track added here, after frames were encoded, gives the
        same bytes as one added at the start (a test holds the two against each other)."""
        if self._held is None:
            raise RuntimeError("the audio track is already decided")
        if audio_rate:
            self._audio = self._container.add_stream(AUDIO_CODEC, rate=audio_rate)
            self._audio.layout = "stereo"
        held, self._held = self._held, None
        self._mux(held)

    def _mux(self, packets: list) -> None:
        if self._held is not None:
            self._held.extend(packets)
            return
        for packet in packets:
            self._container.mux(packet)

    def write_frame(self, frame: np.ndarray) -> None:
        image = to_uint8(frame) if frame.dtype != np.uint8 else frame
        video_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
        self._mux(self._video.encode(video_frame))
        self.frames_written += 1

    def write_audio(self, waveform: np.ndarray, sample_rate: int) -> None:
        """waveform (channels, samples) float in [-1, 1]; mono is duplicated to stereo."""
        if self._held is not None:
            raise RuntimeError("open_audio first: the audio track is not decided")
        if self._audio is not None:
            encode_waveform(self._container, self._audio, waveform, sample_rate)

    def end_video(self) -> None:
        """Flush the video encoder now that every frame is in, keeping its packets for `close`: x264's
        lookahead holds some 40 frames back, so the encode's tail (a short clip's whole encode) runs
        here, and the early encode runs it while a task queued behind the decode tiles (the audio
        decode) still runs. `close` muxes the packets where it would have flushed: the same bytes."""
        if self._tail is None:
            self._tail = list(self._video.encode())

    def close(self) -> None:
        if self._held is not None:
            self.open_audio(None)
        self.end_video()
        self._mux(self._tail)
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


def render_audio(get: OutputGetter) -> tuple[np.ndarray | None, int | None]:
    """The render's waveform and its sample rate, (None, None) when it has no audio."""
    waveform, rate = get("audio", "waveform"), get("audio", "sample_rate")
    if waveform is None or rate is None:
        return None, None
    return waveform, int(rate.reshape(-1)[0])


class VideoAssembly:
    """One render's mp4 (+ EXR frames, HLG master, previews) written a frame at a time, then finished
    with its audio and metadata. The whole render's assembly (`assemble_streaming`) and the farm's early
    encode (assemble/early.py: frames written as they become final while the decode still runs, the
    audio track decided at the end) both write through this, so their files are the same bytes."""

    def __init__(self, spec: dict, out_dir: Path, *, audio_rate: int | None = AUDIO_LATER,
                 preview: Path | None = None, exr_dir: Path | None = None, fence: Fence | None = None) -> None:
        self.spec, self.staged, self.out_dir = spec, Staged(fence), Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.exr_dir = None if exr_dir is None else Path(exr_dir)
        if self.exr_dir is not None:
            self.exr_dir.mkdir(parents=True, exist_ok=True)
        self.fps = float(spec.get("output_fps") or spec["frame_rate"])
        self.started, self.memory = time.perf_counter(), PeakMemory().__enter__()
        self.writer = Mp4Writer(self.staged.part(self.out_dir / "render.mp4"), width=spec["width"],
                                height=spec["height"], fps=self.fps, audio_rate=audio_rate)
        self.thumbs = PreviewWriter(preview, int(spec.get("output_frames") or spec["frames"])) if preview else None
        self.sides = SideOutputs(spec, self.staged, self.out_dir, self.exr_dir, self.fps)
        self._open = True

    def add(self, frame: np.ndarray) -> None:
        index = self.writer.frames_written
        self.writer.write_frame(frame)
        if self.thumbs is not None:
            self.thumbs.add(frame)
        self.sides.add(index, frame)

    def end_video(self) -> None:
        """Every frame is in: the mp4's encode finishes now (`Mp4Writer.end_video`), not at `finish`."""
        self.writer.end_video()

    def close(self) -> None:
        """Close the files (idempotent); an unfinished assembly's part files are left for the next."""
        if not self._open:
            return
        self._open = False
        try:
            self.writer.close()
        finally:
            if self.thumbs is not None:
                self.thumbs.close()
            self.sides.close()
            self.memory.__exit__(None, None, None)

    def abandon(self) -> None:
        """Close and remove this assembly's hidden part files: it will not be finished."""
        self.close()
        for path in (self.out_dir / "render.mp4", self.sides.hlg_path):
            if path is not None:
                self.staged.part(path).unlink(missing_ok=True)

    def finish(self, get: OutputGetter, runs: list[dict] | None, decode_info: dict) -> Path:
        """The audio (fitted to the frames written) muxed at the end, the files published, render.json
        written beside them; returns the mp4."""
        waveform, rate = render_audio(get)
        try:
            if self.writer.audio_pending:
                self.writer.open_audio(rate)
            if waveform is not None and rate:
                waveform = fit_audio(waveform, rate, self.writer.frames_written, self.fps)
                self.writer.write_audio(waveform, rate)
        finally:
            self.close()
        mp4 = self.staged.publish(self.out_dir / "render.mp4")
        self.sides.publish()
        self._write_metadata(mp4, waveform, rate, runs, decode_info)
        return mp4

    def _write_metadata(self, mp4: Path, waveform: np.ndarray | None, rate: int | None, runs: list[dict] | None,
                        decode_info: dict) -> None:
        frames, spec = self.writer.frames_written, self.spec
        assembly = {"seconds": round(time.perf_counter() - self.started, 3), "peak_traced_bytes": self.memory.peak,
                    "window_bytes": decode_info["window_bytes"],
                    "clip_bytes": frames * spec["height"] * spec["width"] * 3 * 4, **decode_info}
        audio = None if waveform is None else {"sample_rate": rate, "samples": int(waveform.shape[-1]),
                                               "seconds": round(waveform.shape[-1] / rate, 4)}
        outputs = {"mp4": str(mp4), "exr_dir": str(self.exr_dir) if self.exr_dir else None,
                   "exr_frames": frames if self.exr_dir else 0,
                   "hlg_mp4": str(self.sides.hlg_path) if self.sides.hlg_path else None}
        meta = build_metadata(spec, frames=frames, fps=self.fps, audio=audio, assembly=assembly,
                              runs=runs or [], outputs=outputs)
        for folder in (self.out_dir, self.exr_dir) if self.exr_dir is not None else (self.out_dir,):
            write_metadata(self.staged.part(folder / "render.json"), meta)
            self.staged.publish(folder / "render.json")


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
    if not recipe_for(RenderPlan.from_stored(spec)).video:  # T2A: the waveform alone, as a WAV (assemble/audio_file.py)
        staged = Staged(fence)
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return assemble_audio(spec, get, Path(out_dir), runs, staged.part, staged.publish)
    assembly = VideoAssembly(spec, out_dir, audio_rate=render_audio(get)[1], preview=preview, exr_dir=exr_dir,
                             fence=fence)
    try:
        frames, decode_info = video_frames(spec, get)
        for frame in frames:
            assembly.add(frame)
        return assembly.finish(get, runs, decode_info)
    finally:
        assembly.close()
