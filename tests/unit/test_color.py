"""Parity of the HDR colour transforms (ltx_engine/rules/color.py) against the standards, float32 <= 1e-4 relative.

ltx-core==1.0.0, the farm's parity reference, has no colour module (upstream added `ltx_core.hdr` and
`ltx_core.color` in 1.2.0), so this test writes the standards' formulas itself, scalar by scalar in
float64, and checks the published reference values: ITU-R BT.2100 Table 5 (HLG), ACES S-2016-001
(ACEScct), S-2014-004 / TB-2014-004 (the AP0 / AP1 matrices), IEC 61966-2-1 (sRGB), SMPTE RP 177 (the
normalised primary matrix) and Bradford's cone matrix for D65 <-> the ACES white.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ltx_engine.rules import color

REL = 1e-4
RNG = np.random.default_rng(29)


def close(got, want, rel: float = REL, floor: float = 1e-6) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    err = np.abs(got - want) / np.maximum(np.abs(want), floor)
    assert err.max() <= rel, f"max rel error {err.max():.2e} at {np.unravel_index(err.argmax(), err.shape)}"


# ------------------------------------------------------------------ the standards, written here


def hlg_oetf(e: float) -> float:  # BT.2100 Table 5
    a = 0.17883277
    b, c = 1 - 4 * a, 0.5 - a * math.log(4 * a)
    return math.sqrt(3 * e) if e <= 1 / 12 else a * math.log(12 * e - b) + c


def hlg_inverse_oetf(s: float) -> float:
    a = 0.17883277
    b, c = 1 - 4 * a, 0.5 - a * math.log(4 * a)
    return s * s / 3 if s <= 0.5 else (math.exp((s - c) / a) + b) / 12


def hlg_ootf(rgb: tuple[float, float, float], lw: float) -> list[float]:
    gamma = 1.2 + 0.42 * math.log10(lw / 1000)
    ys = 0.2627 * rgb[0] + 0.6780 * rgb[1] + 0.0593 * rgb[2]
    return [lw * ys ** (gamma - 1) * v for v in rgb]


def acescct(lin: float) -> float:  # S-2016-001
    if lin <= 0.0078125:
        return 10.5402377416545 * lin + 0.0729055341958355
    return (math.log2(lin) + 9.72) / 17.52


def acescct_inverse(v: float) -> float:
    if v <= 0.155251141552511:
        return (v - 0.0729055341958355) / 10.5402377416545
    if v < (math.log2(65504) + 9.72) / 17.52:
        return 2 ** (v * 17.52 - 9.72)
    return 65504.0


def srgb_eotf(v: float) -> float:  # IEC 61966-2-1
    return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4


def npm(prims: list[tuple[float, float]], white: tuple[float, float]) -> np.ndarray:  # SMPTE RP 177
    def xyz(x, y):
        return [x / y, 1.0, (1 - x - y) / y]
    p = np.array([xyz(*c) for c in prims]).T
    return p * np.linalg.solve(p, xyz(*white))


# ------------------------------------------------------------------ HLG


def test_hlg_oetf_known_values_and_the_formula() -> None:
    close(color.hlg_oetf(np.array([1 / 12])), [0.5])  # the segments meet at E = 1/12, E' = 1/2
    close(color.hlg_oetf(np.array([1.0])), [1.0])
    close(color.hlg_oetf(np.array([0.0, 1e-9])), [0.0, math.sqrt(3e-9)], floor=1e-3)
    assert (color.HLG_B, round(color.HLG_C, 8)) == (pytest.approx(0.28466892, abs=1e-9), 0.55991073)
    e = np.concatenate([RNG.uniform(1e-4, 1.0, 2000), np.linspace(0.05, 0.12, 200)])
    close(color.hlg_oetf(e), [hlg_oetf(v) for v in e])
    close(color.hlg_inverse_oetf(np.array([0.5, 0.75, 1.0])), [1 / 12, hlg_inverse_oetf(0.75), 1.0])
    s = RNG.uniform(0.01, 1.0, 2000)
    close(color.hlg_inverse_oetf(s), [hlg_inverse_oetf(v) for v in s])
    close(color.hlg_inverse_oetf(color.hlg_oetf(e)), e, rel=3e-4)  # float32 round trip


def test_hlg_ootf_and_eotf() -> None:
    assert color.hlg_system_gamma(1000) == 1.2 and color.hlg_system_gamma(2000) == pytest.approx(1.2 + 0.42 * math.log10(2))
    rgb = RNG.uniform(0.01, 1.0, (500, 3))
    for lw in (1000.0, 400.0, 2000.0):
        close(color.hlg_ootf(rgb, lw), [hlg_ootf(tuple(v), lw) for v in rgb])
        close(color.hlg_inverse_ootf(color.hlg_ootf(rgb, lw), lw), rgb, rel=3e-4)
    close(color.hlg_ootf(np.ones((1, 3)), 1000.0), [[1000.0] * 3])  # peak white -> L_W
    close(color.hlg_eotf(np.full((1, 3), 0.75)), [hlg_ootf((hlg_inverse_oetf(0.75),) * 3, 1000.0)])
    assert color.hlg_eotf(np.zeros((1, 3)), 1000.0, 0.01).min() > 0  # the black lift beta


# ------------------------------------------------------------------ ACEScct and sRGB


def test_acescct_known_values_and_the_formula() -> None:
    close(color.acescct_encode(np.array([0.18])), [0.4135884])  # S-2016-001: mid grey
    close(color.acescct_encode(np.array([0.0078125, 0.0])), [0.155251141552511, 0.0729055341958355])
    close(color.acescct_decode(np.array([0.4135884])), [0.18])
    lin = np.concatenate([RNG.uniform(-0.01, 0.0078125, 500), np.exp(RNG.uniform(-5, 9, 2000))])
    close(color.acescct_encode(lin), [acescct(v) for v in lin])
    codes = RNG.uniform(0.0, 1.5, 2000)
    close(color.acescct_decode(codes), [acescct_inverse(v) for v in codes], floor=1e-4)
    close(color.acescct_decode(color.acescct_encode(lin)), lin, floor=1e-3)
    assert color.acescct_decode(np.array([1.6]))[0] == 65504.0


def test_srgb_eotf_and_its_inverse() -> None:
    v = np.concatenate([np.linspace(0.0, 1.0, 1001), [0.04045]])
    close(color.srgb_eotf(v), [srgb_eotf(x) for x in v])
    close(color.srgb_inverse_eotf(color.srgb_eotf(v)), v, floor=1e-3)


# ------------------------------------------------------------------ primaries and matrices


def test_ap0_ap1_matrices_are_the_aces_documents() -> None:
    ap0_to_xyz = [[0.9525523959, 0.0, 0.0000936786], [0.3439664498, 0.7281660966, -0.0721325464],
                  [0.0, 0.0, 1.0088251844]]  # SMPTE ST 2065-1 / S-2014-004
    ap1_to_xyz = [[0.6624541811, 0.1340042065, 0.1561876870], [0.2722287168, 0.6740817658, 0.0536895174],
                  [-0.0055746495, 0.0040607335, 1.0103391003]]  # S-2014-004
    ap1_to_ap0 = [[0.6954522414, 0.1406786965, 0.1638690622], [0.0447945634, 0.8596711185, 0.0955343182],
                  [-0.0055258826, 0.0040252103, 1.0015006723]]  # TB-2014-004
    close(color.rgb_to_xyz_matrix(color.AP0), ap0_to_xyz, floor=1e-3)
    close(color.rgb_to_xyz_matrix(color.AP1), ap1_to_xyz, floor=1e-3)
    close(color.rgb_to_rgb_matrix(color.AP1, color.AP0), ap1_to_ap0, floor=1e-3)
    close(color.xyz_to_rgb_matrix(color.AP1), np.linalg.inv(ap1_to_xyz), floor=1e-3)
    aces = color.WHITE_ACES
    close(color.rgb_to_xyz_matrix(color.AP0), npm([(0.7347, 0.2653), (0.0, 1.0), (0.0001, -0.077)], aces), floor=1e-3)


def test_bt709_bt2020_matrices_and_bradford_to_acescg() -> None:
    d65 = (0.3127, 0.3290)
    m709 = npm([(0.64, 0.33), (0.30, 0.60), (0.15, 0.06)], d65)
    m2020 = npm([(0.708, 0.292), (0.170, 0.797), (0.131, 0.046)], d65)
    close(color.rgb_to_xyz_matrix(color.BT709), m709, floor=1e-3)
    close(color.rgb_to_xyz_matrix(color.BT2020)[1], [0.2627, 0.6780, 0.0593])  # BT.2020's luma weights
    np.testing.assert_allclose(color.rgb_to_rgb_matrix(color.BT709, color.BT2020),  # BT.2087, to its 4 digits
                               [[0.6274, 0.3293, 0.0433], [0.0691, 0.9195, 0.0114], [0.0164, 0.0880, 0.8956]],
                               rtol=0, atol=5e-5)
    close(color.rgb_to_rgb_matrix(color.BT709, color.BT2020), np.linalg.inv(m2020) @ m709, floor=1e-3)
    bradford = np.array([[0.8951, 0.2664, -0.1614], [-0.7502, 1.7135, 0.0367], [0.0389, -0.0685, 1.0296]])

    def white(xy):
        return np.array([xy[0] / xy[1], 1.0, (1 - xy[0] - xy[1]) / xy[1]])
    cat = np.linalg.inv(bradford) @ np.diag((bradford @ white(color.WHITE_ACES)) / (bradford @ white(d65))) @ bradford
    ap1 = npm([(0.713, 0.293), (0.165, 0.830), (0.128, 0.044)], color.WHITE_ACES)
    srgb_to_acescg = np.linalg.inv(ap1) @ cat @ m709
    close(color.rgb_to_rgb_matrix(color.BT709, color.AP1), srgb_to_acescg, floor=1e-3)
    close(srgb_to_acescg, [[0.6130974, 0.3395231, 0.0473795], [0.0701937, 0.9163539, 0.0134524],
                           [0.0206156, 0.1095698, 0.8698147]], floor=1e-3)  # OpenColorIO's ACES config
    close(color.apply_matrix(srgb_to_acescg, np.ones(3)), np.ones(3))  # D65 white -> ACES white, neutral
    unadapted = color.rgb_to_rgb_matrix(color.BT709, color.AP1, adapt=False)
    close(unadapted, np.linalg.inv(ap1) @ m709, floor=1e-3)


def test_exr_colorspaces_convert_through_the_transforms() -> None:
    frame = RNG.uniform(0.0, 1.0, (4, 5, 3)).astype(np.float32)
    linear = np.vectorize(srgb_eotf)(frame.astype(np.float64))
    close(color.sdr_to_exr(frame, "srgb-linear"), linear, floor=1e-3)
    acescg = linear @ color.rgb_to_rgb_matrix(color.BT709, color.AP1).T
    close(color.sdr_to_exr(frame, "acescg"), acescg, floor=1e-3)
    close(color.sdr_to_exr(frame, "acescct"), np.vectorize(acescct)(acescg))
    with pytest.raises(ValueError, match="not one of srgb-linear, acescg, acescct"):
        color.sdr_to_exr(frame, "rec2020")
