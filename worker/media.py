"""The media encode tasks on a worker: a user's track and a source clip's tiles.

The file arrives as the blob the client uploaded (raw bytes, `transfer.as_array`'s uint8 view), after
the coordinator's probe refused what is not media of the needed kind. It is decoded here, where the
encoder runs (resampling the audio to the VAE's rate, and the video to the render's rate and size,
cost the coordinator nothing), in a child process under memory, CPU and wall limits
(`worker.media_child`), so a crafted file fails its task and never takes the worker down.
"""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ltx_engine.rules.media import image_to_pixels

_ROOT = str(Path(__file__).resolve().parent.parent)
DECODE_MEMORY_MB = "FARM_MEDIA_DECODE_MB"  # the child's address-space cap (default 4096 MB)
CPU_S, WALL_S = 120.0, 300.0


class MediaDecodeError(RuntimeError):
    """The child gave no decode: its one line (the file's fault, or a limit it ran past)."""


def _decode(kind: str, args: dict, data: np.ndarray) -> Path:
    """Run the child on `data`; the path of what it wrote (the caller reads and removes it)."""
    memory = int(float(os.environ.get(DECODE_MEMORY_MB) or 4096) * 2**20)
    folder = Path(tempfile.mkdtemp(prefix="farm-media-"))
    src, out = folder / "in", folder / "out"
    data.tofile(src)
    cmd = [
        sys.executable,
        "-s",
        "-m",
        "worker.media_child",
        kind,
        json.dumps({**args, "memory_bytes": memory, "cpu_s": CPU_S}),
        str(src),
        str(out),
    ]
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR")}
    try:
        proc = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=WALL_S,
            check=False,
            env={**env, "PYTHONPATH": _ROOT},
            cwd=_ROOT,
        )
    except subprocess.TimeoutExpired:
        raise MediaDecodeError(f"{kind} decode ran past {WALL_S:g} s") from None
    finally:
        src.unlink(missing_ok=True)
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr.decode(errors="replace").strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise MediaDecodeError(f"{kind} decode failed: {tail[:300]}")
    return out


def _read(path: Path, load):
    try:
        with open(path, "rb") as f:
            return load(f)
    finally:
        path.unlink(missing_ok=True)
        path.parent.rmdir()


def audio_encode(engine, pack, params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The clip's window of the track -> its audio latent (zero-padded to DFR's canvas when planned so),
    and the window at the file's rate (the mux's)."""
    seconds = int(params["frames"]) / float(params["fps"])
    args = {"start": float(params.get("start") or 0.0), "seconds": seconds}
    got = _read(_decode("audio", args, inputs["audio"]), lambda f: dict(np.load(f)))
    wave, rate = got["wave"], int(got["rate"][0])
    latent = engine.encode_audio(pack, wave, rate, seconds, int(params["audio_frames"]))
    if params.get("pad_audio_frames"):  # DFR's canvas is longer than the clip (`a2v --dfr`)
        from ltx_engine.rules.audio_source import fit_audio_tokens

        latent = fit_audio_tokens(latent, int(params["pad_audio_frames"]))
    return {"latent": latent, "waveform": wave, "sample_rate": np.array([rate], dtype=np.int32)}


def hdr_tile(rgb: np.ndarray, height: int, width: int, hdr: dict) -> np.ndarray:
    """An SDR frame (resized and centre-cropped only when it is not the render's size) as the
    HDR IC-LoRA's working codes in the VAE's range, (1, 3, 1, height, width) float32."""
    from ltx_engine.rules.hdr import sdr_working, to_vae_range
    from ltx_engine.rules.media import resize_center_crop

    frame = rgb if rgb.shape[:2] == (height, width) else resize_center_crop(rgb, height, width)
    codes = to_vae_range(sdr_working(frame, hdr["transfer"], hdr["input_colorspace"]))
    return np.ascontiguousarray(codes.transpose(2, 0, 1)[None, :, None])


def tile_pixels(
    data: np.ndarray, pixels: list, height: int, width: int, fps: float | None = None, hdr: dict | None = None
) -> np.ndarray:
    """One encode tile of the clip (`pixels`: [start, stop) per t, h, w, in render frames): the clip's
    frames at the render's `fps` picked by their timestamps and fitted to its size
    (`ltx_engine.rules.clip_frames.resample_clip`; `fps` None: by index): (1, 3, f, h, w) float32 in [-1, 1].
    `hdr`: the HDR IC-LoRA's working codes instead (`hdr_tile`)."""
    import av

    from ltx_engine.rules.clip_frames import resample_clip

    span, rows, cols = (tuple(int(x) for x in axis) for axis in pixels)
    fit = image_to_pixels if hdr is None else functools.partial(hdr_tile, hdr=hdr)
    with av.open(io.BytesIO(data.tobytes())) as container:
        stream = container.streams.video[0]
        frames = ((frame.time, frame) for frame in container.decode(stream))
        rate = float(stream.average_rate or stream.guessed_rate or fps or 1.0)
        return resample_clip(
            frames,
            span,
            (height, width),
            (rows, cols),
            fps,
            rate,
            lambda f: f.to_ndarray(format="rgb24"),
            fit,
        )


def frames_tile(frames: np.ndarray, pixels: list, height: int, width: int) -> np.ndarray:
    """One encode tile of frames the farm decoded (uint8 (F, H, W, 3), a chunked render's carry), taken by
    index and fitted to the size as a clip's frames are: (1, 3, f, h, w) float32 in [-1, 1]."""
    from ltx_engine.rules.clip_frames import resample_clip

    span, rows, cols = (tuple(int(x) for x in axis) for axis in pixels)
    return resample_clip(((None, f) for f in frames), span, (height, width), (rows, cols), None, 1.0)


def video_encode(engine, pack, params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One tile of the source clip (or of decoded frames: no file, no child) -> its latent tile."""
    if "frames" in inputs:
        video = frames_tile(inputs["frames"], params["pixels"], int(params["height"]), int(params["width"]))
        return {"latent": engine.encode_video_tile(pack, video)}
    first = int(params.get("first") or 0)  # the render frame (of the clip at its rate) the tile starts at
    pixels = [[f + first for f in params["pixels"][0]], *params["pixels"][1:]]
    args = {
        "pixels": pixels,
        "height": int(params["height"]),
        "width": int(params["width"]),
        "hdr": params.get("hdr"),
    }
    fps = params.get("fps")  # the render's rate: the clip's frames picked by timestamp (None: by index)
    args["fps"] = None if fps is None else float(fps)
    video = _read(_decode("video", args, inputs["video"]), np.load)
    return {"latent": engine.encode_video_tile(pack, video)}


def control_mask(pack, params: dict, inputs: dict[str, np.ndarray], step=None) -> dict[str, np.ndarray]:
    """An IC-LoRA control's mask clip -> (1, f*h*w) attention strengths of its reference tokens: frames
    [first, first + F) at the stage's size, grey in [0, 1] and pooled to the reference latent's grid as
    upstream's `_load_mask_video` + `downsample_mask_video_to_latent` (`ltx_engine.rules.ic_lora`)."""
    from ltx_engine.rules.ic_lora import latent_mask, mask_from_pixels

    first, frames = int(params.get("first") or 0), int(params["frames"])
    height, width = int(params["height"]), int(params["width"])
    args = {"pixels": [[first, first + frames], [0, height], [0, width]], "height": height, "width": width,
            "hdr": None, "fps": None}
    pixels = _read(_decode("video", args, inputs["video"]), np.load)
    return {"mask": latent_mask(mask_from_pixels(pixels), tuple(int(n) for n in params["grid"]))}
