"""The HLG master: scene-linear frames become a BT.2100 HLG, BT.2020, 10-bit HEVC file through PyAV.

Upstream's HDR IC-LoRA path writes its master as HEVC Main10 (`yuv420p10le`, libx265) tagged BT.2020
primaries, ARIB STD-B67 (HLG) transfer, BT.2020 non-constant-luminance matrix, limited range, `hvc1`.
This module does the same from pure parts (ltx_engine/rules/color.py): BT.709 linear -> BT.2020 (one white
point: no adaptation) -> diffuse white (1.0) onto HLG's reference white at 75 % signal (ITU-R BT.2408,
E = OETF^-1(0.75)), values above it rolled off exponentially toward the signal's top as upstream's
converter does (continuous in value and slope at 1.0) -> the HLG OETF -> Y'CbCr by the BT.2020 NCL
equations, 4:2:0 (the mean of each 2x2 block), 10-bit limited-range codes. Frames stream one at a time.
x265 runs single-threaded at preset ultrafast, CRF 12: the same frames give the same bytes (its medium
preset does not), so the farm's master equals `farm render --local`'s.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from ltx_engine.rules import color, hdr

F32 = np.float32
HLG_FILE = "render_hlg.mp4"  # in the render's folder (`--hdr`); clients write it as OUTPUT.hlg.mp4
CODEC = "libx265"
PIX_FMT = "yuv420p10le"
HLG_REFERENCE_WHITE = 0.75  # the signal diffuse white maps to (BT.2408)
# FFmpeg's enum values (AVColorPrimaries, AVColorTransferCharacteristic, AVColorSpace, AVColorRange).
TAGS = {"color_primaries": 9, "color_trc": 18, "colorspace": 9, "color_range": 1}  # bt2020, arib-std-b67, bt2020nc, tv
X265_TAGS = "colorprim=bt2020:transfer=arib-std-b67:colormatrix=bt2020nc:range=limited"
KR, KB = 0.2627, 0.0593  # BT.2020 luma weights (red, blue)


HDR_EXR_DEFAULT = "acescg"  # an HDR IC-LoRA render's EXR frames unless --exr-colorspace says otherwise


def hdr_transfer(spec: dict) -> str | None:
    """The working space an HDR IC-LoRA render's decoded frames are codes of, else None."""
    return hdr.ACESCCT if spec.get("hdr_ic_lora") else None


def hdr_frame(codes: np.ndarray, transfer: str, exr_colorspace: str) -> dict[str, np.ndarray]:
    """One decoded frame of working codes -> `linear_709` (the master's input) and `exr` (the EXR's
    values), the engine's `hdr.outputs` (pixel-wise, so a frame at a time is the clip's)."""
    out = hdr.outputs(codes[None], transfer, exr_colorspace)
    return {k: v[0] for k, v in out.items()}


def hlg_path(output: Path) -> Path:
    """Where a client (or `--local`) puts the master of the mp4 it writes to `output`."""
    return Path(output).with_suffix(".hlg.mp4")


def hlg_signal(linear_709: np.ndarray) -> np.ndarray:
    """(..., 3) scene-linear BT.709 (diffuse white 1.0) -> the HLG signal E' in BT.2020, [0, 1]."""
    rgb = np.maximum(color.apply_matrix(color.rgb_to_rgb_matrix(color.BT709, color.BT2020), linear_709), F32(0.0))
    white = F32(color.hlg_inverse_oetf(np.array([HLG_REFERENCE_WHITE]))[0])
    roll = white / (F32(1.0) - white)
    above = F32(1.0) - (F32(1.0) - white) * np.exp(-roll * (rgb - F32(1.0)))
    return color.hlg_oetf(np.where(rgb <= F32(1.0), rgb * white, above))


def ycbcr_planes(signal: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(H, W, 3) R'G'B' -> 10-bit limited-range Y' (H, W) and Cb, Cr (H/2, W/2) planes, uint16 (BT.2020 NCL)."""
    r, g, b = (signal[..., i].astype(np.float64) for i in range(3))
    y = KR * r + (1.0 - KR - KB) * g + KB * b
    cb, cr = (b - y) / (2.0 * (1.0 - KB)), (r - y) / (2.0 * (1.0 - KR))
    h, w = y.shape

    def half(plane: np.ndarray) -> np.ndarray:
        return plane.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3))

    def code(values: np.ndarray, scale: int, offset: int) -> np.ndarray:
        return np.clip(np.rint((scale * values + offset) * 4), 0, 1023).astype(np.uint16)

    return code(y, 219, 16), code(half(cb), 224, 128), code(half(cr), 224, 128)


def hlg_frame(linear_709: np.ndarray) -> np.ndarray:
    """One (H, W, 3) scene-linear frame as the planes PyAV's yuv420p10le frame holds: (3H/2, W) uint16."""
    y, cb, cr = ycbcr_planes(hlg_signal(linear_709))
    w = y.shape[1]
    return np.concatenate([y, cb.reshape(-1, w), cr.reshape(-1, w)], axis=0)


class HlgMasterWriter:
    """Streams scene-linear BT.709 frames into an HLG 10-bit HEVC mp4 (even width and height)."""

    def __init__(self, path: Path, *, width: int, height: int, fps: float, crf: int = 12, lossless: bool = False):
        if CODEC not in av.codecs_available:
            raise RuntimeError(f"this PyAV build has no {CODEC}: the HLG master is HEVC Main10")
        if width % 2 or height % 2:
            raise ValueError(f"the HLG master is 4:2:0: {width}x{height} needs even sides")
        self.path = Path(path)
        self._container = av.open(str(self.path), mode="w", format="mp4")
        self._video = self._container.add_stream(CODEC, rate=Fraction(fps).limit_denominator(1001))
        self._video.width, self._video.height, self._video.pix_fmt = width, height, PIX_FMT
        for name, value in TAGS.items():
            setattr(self._video.codec_context, name, value)
        params = f"{X265_TAGS}:info=0:log-level=error:pools=1:frame-threads=1" + (":lossless=1" if lossless else "")
        self._video.options = {"crf": str(crf), "preset": "ultrafast", "x265-params": params}  # medium: not repeatable
        self._video.codec_tag = "hvc1"
        self.frames_written = 0

    def write_linear(self, linear_709: np.ndarray) -> None:
        frame = av.VideoFrame.from_ndarray(hlg_frame(linear_709), format=PIX_FMT)
        for name, value in TAGS.items():
            setattr(frame, name, value)
        for packet in self._video.encode(frame):
            self._container.mux(packet)
        self.frames_written += 1

    def close(self) -> None:
        for packet in self._video.encode():
            self._container.mux(packet)
        self._container.close()
