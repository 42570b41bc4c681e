"""The media encode tasks on a worker (issue #24): a user's track and a source clip's tiles.

The file arrives as the blob the client uploaded (raw bytes, `transfer.as_array`'s uint8 view), after
the coordinator's probe refused what is not media of the needed kind; it is decoded here, where the
encoder runs, so resampling (audio to the VAE's rate) and resizing (video to the render's size) cost
the coordinator nothing.
"""

from __future__ import annotations

import io

import numpy as np

from ltx_engine.audio_source import decode_window
from ltx_engine.media import image_to_pixels


def audio_encode(engine, pack, params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The clip's window of the track -> its audio latent, and the window at the file's rate (the mux's)."""
    seconds = int(params["frames"]) / float(params["fps"])
    wave, rate = decode_window(inputs["audio"], float(params.get("start") or 0.0), seconds)
    latent = engine.encode_audio(pack, wave, rate, seconds, int(params["audio_frames"]))
    return {"latent": latent, "waveform": wave, "sample_rate": np.array([rate], dtype=np.int32)}


def source_pixels(data: np.ndarray, frames: int, height: int, width: int) -> np.ndarray:
    """The clip's first `frames` frames, each resized and centre-cropped to the render's size as an
    `--image` is: (1, 3, frames, height, width) float32 in [-1, 1]; a clip that ends first repeats
    its last frame."""
    import av

    out = []
    with av.open(io.BytesIO(data.tobytes())) as container:
        for frame in container.decode(video=0):
            out.append(image_to_pixels(frame.to_ndarray(format="rgb24"), height, width))
            if len(out) == frames:
                break
    if not out:
        raise ValueError("no video frame decoded from the source clip")
    out += [out[-1]] * (frames - len(out))
    return np.concatenate(out, axis=2)


def video_encode(engine, pack, params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One tile of the source clip (`pixels`: [start, stop) per t, h, w) -> its latent tile."""
    (f0, f1), (h0, h1), (w0, w1) = (tuple(int(x) for x in axis) for axis in params["pixels"])
    video = source_pixels(inputs["video"], f1, int(params["height"]), int(params["width"]))
    return {"latent": engine.encode_video_tile(pack, np.ascontiguousarray(video[:, :, f0:f1, h0:h1, w0:w1]))}
