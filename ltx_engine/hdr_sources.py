"""The HDR IC-LoRA's sources read as arrays: an SDR clip (PyAV, rgb24 in coded orientation, as upstream
decodes with PyAV) or a folder of EXR plates (OpenEXR; sorted by name, RGB / RGBA / one mono channel).
`hdr_pipeline.source_codes` takes either: uint8 for a clip, float32 for plates."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ltx_engine.rules.hdr import HdrInputError


def read_sdr_clip(path: str | Path, frame_cap: int | None = None) -> tuple[np.ndarray, float]:
    """(F, H, W, 3) uint8 frames and the stream's fps."""
    import av

    try:
        with av.open(str(path)) as src:
            stream = src.streams.video[0]
            fps = float(stream.average_rate or stream.base_rate or 0)
            frames = []
            for frame in src.decode(stream):
                frames.append(frame.to_ndarray(format="rgb24"))
                if frame_cap is not None and len(frames) >= frame_cap:
                    break
    except (OSError, IndexError, av.error.FFmpegError) as exc:
        raise HdrInputError(f"{path}: not a readable video ({exc})") from exc
    if not frames:
        raise HdrInputError(f"{path}: no video frames")
    return np.stack(frames), fps


def _plate(path: Path) -> np.ndarray:
    import OpenEXR

    with OpenEXR.File(str(path)) as exr:
        channels = exr.channels()
        if "RGB" in channels or "RGBA" in channels:
            rgb = channels.get("RGB", channels.get("RGBA")).pixels[..., :3]
        elif set("RGB") <= set(channels):
            rgb = np.stack([channels[c].pixels for c in "RGB"], axis=-1)
        elif "Y" in channels or len(channels) == 1:
            mono = channels.get("Y", next(iter(channels.values()))).pixels
            rgb = np.repeat(mono[..., None], 3, axis=-1)
        else:
            raise HdrInputError(
                f"{path}: channels {sorted(channels)}; expected RGB, RGBA or one mono channel"
            )
    return np.ascontiguousarray(rgb, dtype=np.float32)


def read_exr_dir(folder: str | Path, frame_cap: int | None = None) -> np.ndarray:
    """(F, H, W, 3) float32 plates of a folder's `*.exr`, in name order."""
    files = sorted(Path(folder).glob("*.exr"))[:frame_cap]
    if not files:
        raise HdrInputError(f"{folder}: no EXR frames")
    return np.stack([_plate(f) for f in files])
