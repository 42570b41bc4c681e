"""The HLG master (coordinator/assemble/hdr_master.py): a 10-bit HEVC file PyAV reads back with BT.2020 primaries,
the ARIB STD-B67 (HLG) transfer, the BT.2020 NCL matrix and limited range, whose planes are the ones the
pure functions computed (exactly when lossless, within a few codes at the master's CRF). This PyAV build
has libx265 (checked: `av.codecs_available`)."""

from __future__ import annotations

import av
import numpy as np
import pytest

from coordinator.assemble.hdr_master import (
    HLG_REFERENCE_WHITE,
    HlgMasterWriter,
    hlg_frame,
    hlg_signal,
    ycbcr_planes,
)
from ltx_engine.rules import color

pytestmark = pytest.mark.timeout(120)


def _frames(n: int = 5) -> list[np.ndarray]:
    ramp = np.linspace(0.0, 1.4, 48 * 64 * 3, dtype=np.float32).reshape(48, 64, 3)
    return [np.roll(ramp, 7 * i, axis=1) for i in range(n)]


def _write(path, frames, **kw) -> None:
    writer = HlgMasterWriter(path, width=64, height=48, fps=24.0, **kw)
    for frame in frames:
        writer.write_linear(frame)
    writer.close()


def test_hlg_signal_maps_diffuse_white_to_the_reference_and_black_to_zero() -> None:
    out = hlg_signal(np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [8.0, 8.0, 8.0]], np.float32))
    np.testing.assert_allclose(out[0], 0.0, atol=1e-6)
    np.testing.assert_allclose(out[1], HLG_REFERENCE_WHITE, rtol=1e-4)  # BT.2408: diffuse white at 75 %
    assert (out[2] > out[1]).all() and (out[2] <= 1.0).all()  # highlights rolled off below the top
    red = hlg_signal(np.array([1.0, 0.0, 0.0], np.float32))  # BT.709 red sits inside BT.2020
    e = color.apply_matrix(color.rgb_to_rgb_matrix(color.BT709, color.BT2020), np.array([1.0, 0.0, 0.0]))
    np.testing.assert_allclose(red, color.hlg_oetf(e * color.hlg_inverse_oetf(np.array([0.75]))[0]), rtol=1e-4)


def test_ycbcr_planes_are_bt2020_ncl_limited_range_10_bit() -> None:
    grey = np.full((2, 2, 3), 0.5, np.float32)
    y, cb, cr = ycbcr_planes(grey)
    assert y.dtype == np.uint16 and y.shape == (2, 2) and cb.shape == cr.shape == (1, 1)
    assert int(y[0, 0]) == round((219 * 0.5 + 16) * 4) and int(cb[0, 0]) == int(cr[0, 0]) == 512  # neutral chroma
    white, black = ycbcr_planes(np.ones((2, 2, 3), np.float32)), ycbcr_planes(np.zeros((2, 2, 3), np.float32))
    assert int(white[0][0, 0]) == 940 and int(black[0][0, 0]) == 64


def test_the_master_reads_back_hlg_tagged_10_bit_hevc(tmp_path) -> None:
    assert "libx265" in av.codecs_available
    frames = _frames()
    _write(tmp_path / "lossless.mp4", frames, lossless=True)
    _write(tmp_path / "master.mp4", frames)
    for name in ("lossless.mp4", "master.mp4"):
        with av.open(str(tmp_path / name)) as container:
            stream = container.streams.video[0]
            ctx = stream.codec_context
            assert (ctx.name, ctx.pix_fmt, ctx.profile, stream.codec_tag) == ("hevc", "yuv420p10le", "Main 10", "hvc1")
            assert (ctx.color_primaries, ctx.color_trc, ctx.colorspace, ctx.color_range) == (9, 18, 9, 1)
            decoded = [f.to_ndarray() for f in container.decode(stream)]
        assert len(decoded) == len(frames) and decoded[0].dtype == np.uint16 and decoded[0].max() > 255  # 10 bits
        diffs = [np.abs(d.astype(np.int32) - hlg_frame(f).astype(np.int32)) for d, f in zip(decoded, frames, strict=True)]
        if name == "lossless.mp4":
            assert max(int(d.max()) for d in diffs) == 0  # the planes the pure functions computed
        else:
            assert max(float(d.mean()) for d in diffs) < 2.0, [float(d.mean()) for d in diffs]


def test_odd_sides_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="needs even sides"):
        HlgMasterWriter(tmp_path / "odd.mp4", width=63, height=48, fps=24.0)
