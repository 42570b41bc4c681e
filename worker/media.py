"""The media encode tasks on a worker (issue #24): a user's track and a source clip's tiles.

The file arrives as the blob the client uploaded (raw bytes, `transfer.as_array`'s uint8 view), after
the coordinator's probe refused what is not media of the needed kind. It is decoded here, where the
encoder runs (resampling the audio to the VAE's rate and resizing the video to the render's size cost
the coordinator nothing), in a child process under memory, CPU and wall limits (`worker.media_child`),
so a crafted file fails its task and never takes the worker down.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ltx_engine.media import image_to_pixels

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
    """The clip's window of the track -> its audio latent, and the window at the file's rate (the mux's)."""
    seconds = int(params["frames"]) / float(params["fps"])
    args = {"start": float(params.get("start") or 0.0), "seconds": seconds}
    got = _read(_decode("audio", args, inputs["audio"]), lambda f: dict(np.load(f)))
    wave, rate = got["wave"], int(got["rate"][0])
    latent = engine.encode_audio(pack, wave, rate, seconds, int(params["audio_frames"]))
    return {"latent": latent, "waveform": wave, "sample_rate": np.array([rate], dtype=np.int32)}


def hdr_tile(rgb: np.ndarray, height: int, width: int, hdr: dict) -> np.ndarray:
    """Issue #29: an SDR frame (resized and centre-cropped only when it is not the render's size) as the
    HDR IC-LoRA's working codes in the VAE's range, (1, 3, 1, height, width) float32."""
    from ltx_engine.hdr import sdr_working, to_vae_range
    from ltx_engine.media import resize_center_crop

    frame = rgb if rgb.shape[:2] == (height, width) else resize_center_crop(rgb, height, width)
    codes = to_vae_range(sdr_working(frame, hdr["transfer"], hdr["input_colorspace"]))
    return np.ascontiguousarray(codes.transpose(2, 0, 1)[None, :, None])


def tile_pixels(
    data: np.ndarray, pixels: list, height: int, width: int, hdr: dict | None = None
) -> np.ndarray:
    """One encode tile of the clip (`pixels`: [start, stop) per t, h, w) from its first frames, each
    resized and centre-cropped to the render's size as an `--image` is (upstream's retake takes the
    first frames as they are, without a frame-rate change): (1, 3, f, h, w) float32 in [-1, 1]; a
    clip that ends first repeats its last frame. `hdr`: the HDR IC-LoRA's working codes instead (`hdr_tile`)."""
    import av

    (f0, f1), (h0, h1), (w0, w1) = (tuple(int(x) for x in axis) for axis in pixels)

    def tile(frame) -> np.ndarray:
        rgb = frame.to_ndarray(format="rgb24")
        full = image_to_pixels(rgb, height, width) if hdr is None else hdr_tile(rgb, height, width, hdr)
        return full[:, :, :, h0:h1, w0:w1]

    out, last = [], None
    with av.open(io.BytesIO(data.tobytes())) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i >= f1:
                break
            last = frame
            if i >= f0:
                out.append(tile(frame))
        if last is None:
            raise ValueError("no video frame decoded from the source clip")
        out += [tile(last)] * (f1 - f0 - len(out))
    return np.ascontiguousarray(np.concatenate(out, axis=2))


def video_encode(engine, pack, params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One tile of the source clip -> its latent tile."""
    first = int(params.get("first") or 0)  # the clip's frame the encoded frames start at
    pixels = [[f + first for f in params["pixels"][0]], *params["pixels"][1:]]
    args = {
        "pixels": pixels,
        "height": int(params["height"]),
        "width": int(params["width"]),
        "hdr": params.get("hdr"),
    }
    video = _read(_decode("video", args, inputs["video"]), np.load)
    return {"latent": engine.encode_video_tile(pack, video)}
