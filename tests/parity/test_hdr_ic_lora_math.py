"""The HDR IC-LoRA's colour ends against upstream's formulas, written here (ltx-core 1.0.0 has no `hdr`
module; these are upstream main's `ltx_core.hdr` / `ltx_core.color.{primaries,hlg}` and the MLX port's
`utils/hdr_media.py`, which follows upstream v1.4), float64 here vs the engine's float32, <= 1e-4.

- ACEScct (S-2016-001 as upstream writes it): compress clamps x >= 0, log branch for x > 2^-7, output
  clamped to [0, 1]; decompress clamps to [0, 1], log branch above 0.155251141552511.
- LogC3 (ARRI EI 800), upstream's constants.
- Matrices: upstream's ACEScg -> sRGB table (5 decimals) and its float64 inverse, the MLX port's
  colour-science table; BT.709 -> BT.2020 (BT.2087).
- The SDR chain (/255, sRGB EOTF, 709 -> AP1, ACEScct, x 2 - 1), the output chain ((x + 1) / 2 clamped,
  decompress, AP1 -> 709, clamp at 0) and the HLG signal (diffuse white at 0.75, exponential roll-off).
"""

from __future__ import annotations

import numpy as np
import pytest

from ltx_engine.rules import hdr

F64 = np.float64
UP_ACESCG_TO_SRGB = np.array(
    [[1.70505, -0.62179, -0.08326], [-0.13026, 1.14080, -0.01055], [-0.02400, -0.12897, 1.15297]], F64
)
UP_SRGB_TO_ACESCG = np.linalg.inv(UP_ACESCG_TO_SRGB)
PORT_REC709_TO_ACESCG = np.array(
    [
        [0.6130974024011875, 0.33952314618410556, 0.04737945141470665],
        [0.07019372246958185, 0.9163538790573443, 0.01345239847307413],
        [0.02061559288222692, 0.10956977293813541, 0.8698146341796376],
    ]
)
PORT_ACESCG_TO_REC709 = np.array(
    [
        [1.705050992657984, -0.6217921206570046, -0.0832588720009786],
        [-0.1302564175070437, 1.1408047365754013, -0.010548319068358037],
        [-0.02400335680461801, -0.12896897606497054, 1.1529723328695887],
    ]
)
UP_REC709_TO_2020 = np.array(
    [
        [0.62740389, 0.32928304, 0.04331307],
        [0.06909729, 0.91954040, 0.01136232],
        [0.01639144, 0.08801331, 0.89559525],
    ]
)


def up_acescct_compress(x):
    x = np.maximum(x, 0.0)
    log = (np.log2(np.maximum(x, 1e-12)) + 9.72) / 17.52
    return np.clip(np.where(x > 0.0078125, log, 10.5402377416545 * x + 0.0729055341958355), 0.0, 1.0)


def up_acescct_decompress(ct):
    ct = np.clip(ct, 0.0, 1.0)
    return np.where(
        ct > 0.155251141552511, 2.0 ** (ct * 17.52 - 9.72), (ct - 0.0729055341958355) / 10.5402377416545
    )


def up_logc3_compress(x):
    x = np.maximum(x, 0.0)
    log = 0.247190 * np.log10(5.555556 * x + 0.052272) + 0.385537
    return np.clip(np.where(x >= 0.010591, log, 5.367655 * x + 0.092809), 0.0, 1.0)


def up_logc3_decompress(c):
    c = np.clip(c, 0.0, 1.0)
    cut = 5.367655 * 0.010591 + 0.092809
    return np.where(
        c >= cut, (10.0 ** ((c - 0.385537) / 0.247190) - 0.052272) / 5.555556, (c - 0.092809) / 5.367655
    )


def up_srgb_eotf(x):
    x = np.clip(x, 0.0, 1.0)
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4)


def up_hlg_signal(linear_709, white_signal=0.75):
    a, b, c = 0.17883277, 0.28466892, 0.55991073
    white = white_signal**2 / 3.0 if white_signal <= 0.5 else (np.exp((white_signal - c) / a) + b) / 12.0
    k = white / (1.0 - white)
    lin = np.maximum(linear_709 @ UP_REC709_TO_2020.T, 0.0)
    x = np.where(lin <= 1.0, lin * white, 1.0 - (1.0 - white) * np.exp(-k * (lin - 1.0)))
    sig = np.where(
        x <= 1 / 12, np.sqrt(np.maximum(3 * x, 0.0)), a * np.log(np.maximum(12 * x - b, 1e-12)) + c
    )
    return np.clip(sig, 0.0, 1.0)


def close(got, want, tol=1e-4):
    got, want = np.asarray(got, F64), np.asarray(want, F64)
    assert np.isfinite(got).all()
    np.testing.assert_array_less(np.abs(got - want), tol * np.maximum(1.0, np.abs(want)))


LINEAR = np.concatenate(
    [[-1.0, 0.0, 1e-5, 0.0078125, 0.0078126, 0.18, 1.0, 10.0, 222.0, 1e4], np.geomspace(1e-6, 300, 200)]
)
CODES = np.concatenate([[-0.5, 0.0, 0.155251141552511, 0.1553, 0.5, 1.0, 1.5], np.linspace(0, 1, 301)])


@pytest.mark.parametrize(
    "transfer, comp, decomp",
    [
        (hdr.ACESCCT, up_acescct_compress, up_acescct_decompress),
        (hdr.LOGC3, up_logc3_compress, up_logc3_decompress),
    ],
)
def test_transfers_match_upstreams_curves(transfer, comp, decomp):
    close(hdr.compress(LINEAR, transfer), comp(LINEAR))
    close(hdr.decompress(CODES, transfer), decomp(CODES))
    inside = np.geomspace(1e-3, 50, 50)  # LogC3 reaches 1.0 at ~55 linear, ACEScct at ~222
    close(hdr.decompress(hdr.compress(inside, transfer), transfer), inside)


def test_primaries_match_upstream_and_the_ports_tables():
    rgb = np.random.default_rng(0).uniform(0, 4, (64, 3))
    for table in (UP_SRGB_TO_ACESCG, PORT_REC709_TO_ACESCG):
        close(hdr.convert(hdr.color.BT709, hdr.color.AP1, rgb), rgb @ table.T)
    for table in (UP_ACESCG_TO_SRGB, PORT_ACESCG_TO_REC709):
        close(hdr.convert(hdr.color.AP1, hdr.color.BT709, rgb), rgb @ table.T)


def test_sdr_input_chain_is_upstreams():
    rng = np.random.default_rng(1)
    rgb8 = np.concatenate([np.repeat(np.arange(256)[:, None], 3, 1), rng.integers(0, 256, (500, 3))]).astype(
        np.uint8
    )
    want = up_acescct_compress(np.maximum(up_srgb_eotf(rgb8 / 255.0) @ UP_SRGB_TO_ACESCG.T, 0.0)) * 2 - 1
    close(hdr.to_vae_range(hdr.sdr_working(rgb8)), want)
    linear = (
        up_acescct_compress(np.maximum((rgb8 / 255.0) @ UP_SRGB_TO_ACESCG.T, 0.0)) * 2 - 1
    )  # --input-colorspace srgb
    close(hdr.to_vae_range(hdr.sdr_working(rgb8, input_colorspace="srgb")), linear)
    close(hdr.sdr_working(rgb8, hdr.LOGC3), rgb8 / 255.0)  # 1.2.0: compress_ldr, the identity clamp
    with pytest.raises(hdr.HdrInputError, match=r"\[0, 1\]"):
        hdr.to_vae_range(np.array([1.2]))


def test_output_chain_and_the_hlg_signal_are_upstreams():
    from coordinator.assemble.hdr_master import hlg_signal

    decoded = np.random.default_rng(2).uniform(-1.2, 1.2, (2, 4, 4, 3))
    codes = np.clip((decoded + 1) / 2, 0, 1)
    out = hdr.outputs(hdr.from_vae_range(decoded), hdr.ACESCCT, "acescg")
    acescg = up_acescct_decompress(codes)
    close(out["exr"], np.maximum(acescg, 0.0))
    # the port's colour-science table: upstream's 5-decimal one is 4.7e-6 off, 1e-3 at ACEScct's top (222)
    linear = np.maximum(acescg @ PORT_ACESCG_TO_REC709.T, 0.0)
    close(out["linear_709"], linear)
    close(hlg_signal(out["linear_709"]), up_hlg_signal(linear))
    np.testing.assert_array_equal(hdr.outputs(codes, hdr.ACESCCT, "acescct")["exr"], codes.astype(np.float32))
    close(hdr.outputs(codes, hdr.ACESCCT, "srgb-linear")["exr"], linear)


def test_exr_plates_enter_the_working_space_as_upstream():
    plates = np.random.default_rng(3).uniform(0, 8, (5, 3))
    close(hdr.exr_working(plates, "acescg"), up_acescct_compress(plates))
    close(
        hdr.exr_working(plates, "srgb-linear"),
        up_acescct_compress(np.maximum(plates @ UP_SRGB_TO_ACESCG.T, 0)),
    )
    close(hdr.exr_working(plates, "acescct"), np.clip(plates, 0, 1))
    with pytest.raises(hdr.HdrInputError, match="rec2020"):
        hdr.exr_working(plates, "rec2020")
