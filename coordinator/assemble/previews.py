"""Preview thumbnails written while a render assembles, so the dashboard shows the picture forming.

The latest finished frame goes to `previews/<render>.png` every few frames (atomically), and a
contact strip of evenly spaced frames to `previews/<render>-strip.png` at the end.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np

THUMB_WIDTH = 256
EVERY_FRAMES = 8
STRIP_FRAMES = 8


def to_uint8(frame: np.ndarray) -> np.ndarray:
    """[0, 1] float pixels to uint8 with rounding; the one conversion every output path uses."""
    return np.clip(np.rint(np.asarray(frame, dtype=np.float32) * 255.0), 0, 255).astype(np.uint8)


def png_bytes(image: np.ndarray) -> bytes:
    """uint8 RGB (H, W, 3) as a PNG (no filtering, zlib level 6): enough for thumbnails, no extra deps."""
    height, width = image.shape[:2]
    raw = b"".join(b"\x00" + image[row].tobytes() for row in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def thumbnail(frame: np.ndarray) -> np.ndarray:
    """A [0, 1] float frame (H, W, 3) shrunk by an integer step to at most THUMB_WIDTH wide, as uint8."""
    step = max(1, -(-frame.shape[1] // THUMB_WIDTH))  # at most THUMB_WIDTH wide
    return to_uint8(frame[::step, ::step])


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class PreviewWriter:
    """Fed every finished frame in order; keeps only thumbnails for the strip."""

    def __init__(self, path: Path, total_frames: int):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.pick = set(np.linspace(0, max(0, total_frames - 1), min(STRIP_FRAMES, total_frames)).round().astype(int))
        self.strip: list[np.ndarray] = []
        self._last: np.ndarray | None = None
        self._count = 0

    def add(self, frame: np.ndarray) -> None:
        thumb = thumbnail(frame)
        self._last = thumb
        if self._count in self.pick:
            self.strip.append(thumb)
        if self._count % EVERY_FRAMES == 0:
            _write_atomic(self.path, png_bytes(thumb))
        self._count += 1

    def close(self) -> None:
        if self._last is None:
            return
        _write_atomic(self.path, png_bytes(self._last))
        if self.strip:
            strip = np.concatenate(self.strip, axis=1)
            _write_atomic(self.path.with_name(self.path.stem + "-strip.png"), png_bytes(strip))
