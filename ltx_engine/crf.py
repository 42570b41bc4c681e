"""The H.264 round trip an image takes before it is VAE-encoded, as upstream's image preprocessing.

Upstream (`ltx_pipelines.utils.media_io.preprocess`, 1.0.0) puts a still through one libx264 frame at a
CRF (33 for LTX-2/2.3, 18 from 2.4 on) before resizing it, so the model sees the codec's artefacts it
was trained on rather than a pristine image. Its facts, followed here: an mp4 in memory, one frame at
rate 1, preset `veryfast`, `crf` as the codec option, the image cropped to even height and width
(bottom/right rows dropped), RGB → yuv420p by PyAV's reformat, the first decoded frame back as RGB;
CRF 0 skips the trip. libx264 is deterministic for one build, so every worker holding the same PyAV
wheel gives the same bytes (the farm's image_encode task runs it, so farm == `--local`).
"""

from __future__ import annotations

import io

import numpy as np


def _encode_frame(image: np.ndarray, crf: int) -> bytes:
    import av

    even = np.ascontiguousarray(image[: image.shape[0] // 2 * 2, : image.shape[1] // 2 * 2, :3])
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=1, options={"crf": str(crf), "preset": "veryfast"})
        stream.height, stream.width = even.shape[:2]
        frame = av.VideoFrame.from_ndarray(even, format="rgb24").reformat(format="yuv420p")
        container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return buffer.getvalue()


def _first_frame(data: bytes) -> np.ndarray:
    import av

    with av.open(io.BytesIO(data)) as container:
        frame = next(container.decode(video=0))
        return frame.to_ndarray(format="rgb24")


def h264_round_trip(image: np.ndarray, crf: int) -> np.ndarray:
    """uint8 RGB (H, W, 3) through one H.264 frame at `crf` and back (H and W cut to even); CRF 0: as is."""
    if int(crf) == 0:
        return np.asarray(image)
    if np.asarray(image).dtype != np.uint8:
        raise ValueError(f"the CRF round trip takes uint8 RGB, got {np.asarray(image).dtype}")
    return _first_frame(_encode_frame(np.asarray(image), int(crf)))
