"""A source clip's frames at the render's rate and size (retake/extend). Pure numpy.

Upstream (ltx-pipelines `decode_video_from_file`) picks a clip's frames by presentation time, frame k
being on screen from its timestamp on, and refuses a clip whose rate is not the output's; the MLX port
takes the clip's first frames as they are. The farm converts instead, by the same timestamps: render
frame i (at the render's fps) is the clip's frame on screen at i / fps, the last whose time is at or
before it. A clip at the render's own rate gives exactly upstream's frames; one at another rate has
frames held (slower clip) or dropped (faster clip), never blended. Each chosen frame is resized to
cover the render's size and centre-cropped, as an `--image` is (`media.image_to_pixels`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

from ltx_engine.rules.media import image_to_pixels

TIME_SLACK = 0.01  # of a render frame: a timestamp this far past i / fps still counts (time-base rounding)


def frames_at_rate(clip_frames: int, clip_fps: float, fps: float) -> int:
    """Render frames at `fps` whose time i / fps falls inside a clip of `clip_frames` at `clip_fps`."""
    return max(0, math.ceil(clip_frames * fps / clip_fps - TIME_SLACK))


def clip_length(clip_frames: int, clip_fps: float, fps: float) -> int:
    """The render's length that covers the whole clip: its frames at `fps`, rounded down to 8k + 1."""
    return 1 + 8 * ((max(1, frames_at_rate(clip_frames, clip_fps, fps)) - 1) // 8)


def resample_clip(
    frames: Iterable[tuple[float | None, object]],
    span: tuple[int, int],
    size: tuple[int, int],
    crop: tuple[tuple[int, int], tuple[int, int]],
    fps: float | None,
    clip_fps: float,
    rgb: Callable[[object], np.ndarray] = np.asarray,
    fit: Callable[[np.ndarray, int, int], np.ndarray] = image_to_pixels,
) -> np.ndarray:
    """Render frames [span) of a clip: (1, 3, f, h, w) float32 in [-1, 1], the VAE encoder's input.

    `frames`: the clip's decoded frames in order with their timestamps in seconds (None: the k-th is at
    k / clip_fps, as upstream falls back). `size`: the render's (height, width) each frame is fitted to;
    `crop`: the tile's ([h0, h1), [w0, w1)) of it. `fps` None picks by index (render frame i = clip frame
    i, what an IC-LoRA control video does). `rgb` turns a frame into (H, W, 3) uint8, called only for
    frames shown; `fit` makes an (H, W, 3) frame the render's (1, 3, 1, h, w) input (an `--image`'s fit,
    or the HDR IC-LoRA's working codes). A clip that ends first repeats its last frame."""
    start, stop = span
    (h0, h1), (w0, w1) = crop
    step = 1.0 if fps is None else 1.0 / fps
    out: list[np.ndarray] = []
    current, tile, origin, i = None, None, None, start

    def shown() -> np.ndarray:
        nonlocal tile
        if tile is None:
            tile = fit(rgb(current), *size)[:, :, :, h0:h1, w0:w1]
        return tile

    for k, (time, frame) in enumerate(frames):
        t = float(k) if fps is None else (k / clip_fps if time is None else float(time))
        origin = t if origin is None else origin
        while current is not None and i < stop and i * step + TIME_SLACK * step < t - origin:
            out.append(shown())
            i += 1
        if i >= stop:
            break
        current, tile = frame, None
    if current is None:
        raise ValueError("no video frame decoded from the source clip")
    out += [shown()] * (stop - start - len(out))
    return np.ascontiguousarray(np.concatenate(out, axis=2))
