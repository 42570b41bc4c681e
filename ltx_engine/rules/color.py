"""The HDR path's colour science, as pure numpy functions (no model code: the coordinator imports it).

What is here and where each formula comes from:
- **Primaries and white points** (CIE 1931 xy): BT.709 / sRGB and BT.2020 with D65 (0.3127, 0.3290);
  ACES AP0 and AP1 with the ACES white point (0.32168, 0.33767) (SMPTE ST 2065-1, S-2014-004).
- **RGB <-> XYZ** from the primaries and the white point alone (SMPTE RP 177's normalised primary
  matrix): no chromatic adaptation inside them, so AP0/AP1 are exactly the ACES documents' matrices.
- **RGB -> RGB**: between spaces of one white point (AP0 <-> AP1, BT.709 <-> BT.2020), XYZ only; across
  white points (D65 <-> ACES) a von Kries adaptation with the **Bradford** cone matrix, as upstream's
  `ltx_core.color.primaries` builds them (colour-science with Bradford, the source OpenColorIO's ACES
  config uses) and as the ACES CTL's `calculate_cat_matrix` defaults to. `adapt=False` leaves it out.
- **sRGB EOTF** (IEC 61966-2-1), **ACEScct** (ACES S-2016-001, piecewise, the standard's constants) and
  **BT.2100 HLG** (ITU-R BT.2100 Table 5: OETF, its inverse, the OOTF and the EOTF).

Pixels are (..., 3) arrays, float32 out; matrices are derived in float64 and applied in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

F32 = np.float32
XY = tuple[float, float]

WHITE_D65: XY = (0.3127, 0.3290)
WHITE_ACES: XY = (0.32168, 0.33767)


@dataclass(frozen=True, slots=True)
class Primaries:
    """An RGB space's primaries and white point as CIE 1931 xy."""

    name: str
    red: XY
    green: XY
    blue: XY
    white: XY

    def chromaticities(self) -> tuple[float, ...]:
        """The EXR `chromaticities` attribute's order: red, green, blue, white (x, y each)."""
        return (*self.red, *self.green, *self.blue, *self.white)


BT709 = Primaries("bt709", (0.64, 0.33), (0.30, 0.60), (0.15, 0.06), WHITE_D65)  # = sRGB
BT2020 = Primaries("bt2020", (0.708, 0.292), (0.170, 0.797), (0.131, 0.046), WHITE_D65)
AP0 = Primaries("aces-ap0", (0.7347, 0.2653), (0.0, 1.0), (0.0001, -0.0770), WHITE_ACES)
AP1 = Primaries("aces-ap1", (0.713, 0.293), (0.165, 0.830), (0.128, 0.044), WHITE_ACES)

# Bradford's cone response matrix (Lam 1985), the one the ACES CTL and OpenColorIO use.
BRADFORD = np.array([[0.8951, 0.2664, -0.1614],
                     [-0.7502, 1.7135, 0.0367],
                     [0.0389, -0.0685, 1.0296]])


# ------------------------------------------------------------------ matrices


def xy_to_xyz(xy: XY) -> np.ndarray:
    """A chromaticity as XYZ with Y = 1."""
    x, y = xy
    return np.array([x / y, 1.0, (1.0 - x - y) / y])


@cache
def _rgb_to_xyz(p: Primaries) -> np.ndarray:
    columns = np.stack([xy_to_xyz(c) for c in (p.red, p.green, p.blue)], axis=1)
    scale = np.linalg.solve(columns, xy_to_xyz(p.white))  # RGB (1, 1, 1) lands on the white point
    return columns * scale[None, :]


def rgb_to_xyz_matrix(p: Primaries) -> np.ndarray:
    """The normalised primary matrix (float64): linear RGB -> XYZ, white (1, 1, 1) -> the white's XYZ."""
    return _rgb_to_xyz(p).copy()


def xyz_to_rgb_matrix(p: Primaries) -> np.ndarray:
    return np.linalg.inv(_rgb_to_xyz(p))


def bradford_matrix(src_white: XY, dst_white: XY) -> np.ndarray:
    """XYZ under src_white -> XYZ under dst_white (von Kries scaling in Bradford's cone space)."""
    src, dst = BRADFORD @ xy_to_xyz(src_white), BRADFORD @ xy_to_xyz(dst_white)
    return np.linalg.inv(BRADFORD) @ np.diag(dst / src) @ BRADFORD


def rgb_to_rgb_matrix(src: Primaries, dst: Primaries, adapt: bool = True) -> np.ndarray:
    """Linear src RGB -> linear dst RGB (float64), Bradford-adapted when the white points differ."""
    xyz = rgb_to_xyz_matrix(src)
    if adapt and src.white != dst.white:
        xyz = bradford_matrix(src.white, dst.white) @ xyz
    return xyz_to_rgb_matrix(dst) @ xyz


def apply_matrix(matrix: np.ndarray, rgb: np.ndarray) -> np.ndarray:
    """A 3x3 matrix on (..., 3) pixels, in float32."""
    return (np.asarray(rgb, dtype=F32) @ np.asarray(matrix, dtype=F32).T).astype(F32)


# ------------------------------------------------------------------ sRGB (IEC 61966-2-1)


def srgb_eotf(signal: np.ndarray) -> np.ndarray:
    """Display-encoded sRGB [0, 1] -> linear light (the farm's EXR linearisation since its first release)."""
    x = np.asarray(signal, dtype=F32)
    return np.where(x <= F32(0.04045), x / F32(12.92), ((x + F32(0.055)) / F32(1.055)) ** F32(2.4)).astype(F32)


def srgb_inverse_eotf(linear: np.ndarray) -> np.ndarray:
    x = np.asarray(linear, dtype=F32)
    curve = F32(1.055) * np.maximum(x, F32(0.0031308)) ** F32(1 / 2.4) - F32(0.055)
    return np.where(x <= F32(0.0031308), x * F32(12.92), curve).astype(F32)


# ------------------------------------------------------------------ ACEScct (ACES S-2016-001)

ACESCCT_X_BRK = 0.0078125                # linear break point (2**-7)
ACESCCT_Y_BRK = 0.155251141552511        # its ACEScct value
ACESCCT_A = 10.5402377416545             # toe slope
ACESCCT_B = 0.0729055341958355           # toe offset
ACESCCT_HALF_MAX = (math.log2(65504.0) + 9.72) / 17.52  # decodes to half-float's largest finite value


def acescct_encode(linear_ap1: np.ndarray) -> np.ndarray:
    """Linear AP1 (ACEScg) -> ACEScct: a straight toe up to 2**-7, then (log2(x) + 9.72) / 17.52."""
    x = np.asarray(linear_ap1, dtype=F32)
    log = (np.log2(np.maximum(x, F32(ACESCCT_X_BRK))) + F32(9.72)) / F32(17.52)
    return np.where(x <= F32(ACESCCT_X_BRK), F32(ACESCCT_A) * x + F32(ACESCCT_B), log).astype(F32)


def acescct_decode(acescct: np.ndarray) -> np.ndarray:
    """ACEScct -> linear AP1, the standard's inverse (held at 65504 past the half-float ceiling)."""
    c = np.asarray(acescct, dtype=F32)
    top = np.minimum(c, F32(ACESCCT_HALF_MAX))
    log = np.exp2(top * F32(17.52) - F32(9.72))
    out = np.where(c <= F32(ACESCCT_Y_BRK), (c - F32(ACESCCT_B)) / F32(ACESCCT_A), log)
    return np.where(c >= F32(ACESCCT_HALF_MAX), F32(65504.0), out).astype(F32)


# ------------------------------------------------------------------ BT.2100 HLG (ITU-R BT.2100 Table 5)

HLG_A = 0.17883277
HLG_B = 1.0 - 4.0 * HLG_A                      # 0.28466892
HLG_C = 0.5 - HLG_A * math.log(4.0 * HLG_A)    # 0.55991073
HLG_LUMA = (0.2627, 0.6780, 0.0593)            # BT.2020 / BT.2100 luminance weights


def hlg_oetf(scene: np.ndarray) -> np.ndarray:
    """Scene-linear E in [0, 1] -> the HLG signal E' in [0, 1]: sqrt(3E) to 1/12, then a ln(12E - b) + c."""
    e = np.clip(np.asarray(scene, dtype=F32), F32(0.0), F32(1.0))
    log = F32(HLG_A) * np.log(np.maximum(F32(12.0) * e - F32(HLG_B), F32(1e-6))) + F32(HLG_C)
    return np.where(e <= F32(1 / 12), np.sqrt(F32(3.0) * e), log).astype(F32)


def hlg_inverse_oetf(signal: np.ndarray) -> np.ndarray:
    """The HLG signal E' -> scene-linear E: E'^2 / 3 to 1/2, then (exp((E' - c) / a) + b) / 12."""
    s = np.clip(np.asarray(signal, dtype=F32), F32(0.0), F32(1.0))
    exp = (np.exp((s - F32(HLG_C)) / F32(HLG_A)) + F32(HLG_B)) / F32(12.0)
    return np.where(s <= F32(0.5), s * s / F32(3.0), exp).astype(F32)


def hlg_system_gamma(peak_nits: float = 1000.0) -> float:
    """BT.2100's gamma for a display of nominal peak L_W: 1.2 + 0.42 log10(L_W / 1000)."""
    return 1.2 + 0.42 * math.log10(peak_nits / 1000.0)


def hlg_ootf(scene_rgb: np.ndarray, peak_nits: float = 1000.0) -> np.ndarray:
    """Scene-linear RGB (BT.2020, [0, 1]) -> display light in cd/m^2: F_D = L_W * Y_S^(gamma - 1) * E."""
    e = np.asarray(scene_rgb, dtype=F32)
    ys = e @ np.array(HLG_LUMA, dtype=F32)
    gain = np.power(np.maximum(ys, F32(1e-12)), F32(hlg_system_gamma(peak_nits) - 1.0))
    return (F32(peak_nits) * gain[..., None] * e).astype(F32)


def hlg_inverse_ootf(display_rgb: np.ndarray, peak_nits: float = 1000.0) -> np.ndarray:
    """Display light (cd/m^2) -> scene-linear: E = (Y_D / L_W)^((1 - gamma) / gamma) * F_D / L_W."""
    fd = np.asarray(display_rgb, dtype=F32) / F32(peak_nits)
    gamma = hlg_system_gamma(peak_nits)
    yd = fd @ np.array(HLG_LUMA, dtype=F32)
    gain = np.power(np.maximum(yd, F32(1e-12)), F32((1.0 - gamma) / gamma))
    return (gain[..., None] * fd).astype(F32)


def hlg_eotf(signal_rgb: np.ndarray, peak_nits: float = 1000.0, black_nits: float = 0.0) -> np.ndarray:
    """The HLG signal -> display light: OOTF(OETF^-1(max(0, (1 - beta) E' + beta))),
    beta = sqrt(3 (L_B / L_W)^(1 / gamma))."""
    beta = math.sqrt(3.0 * (black_nits / peak_nits) ** (1.0 / hlg_system_gamma(peak_nits)))
    lifted = np.maximum(F32(0.0), F32(1.0 - beta) * np.asarray(signal_rgb, dtype=F32) + F32(beta))
    return hlg_ootf(hlg_inverse_oetf(lifted), peak_nits)


# ------------------------------------------------------------------ the farm's output colourspaces

EXR_COLORSPACES = ("srgb-linear", "acescg", "acescct")  # --exr-colorspace; the first is the default
EXR_TAGS = {"srgb-linear": "sRGB", "acescg": "ACEScg", "acescct": "ACEScct"}  # the EXR colorSpace string


def exr_primaries(colorspace: str) -> Primaries:
    """The primaries an EXR frame of this colourspace is written in (its chromaticities header)."""
    return BT709 if colorspace == "srgb-linear" else AP1


def sdr_to_exr(frame: np.ndarray, colorspace: str) -> np.ndarray:
    """A display-encoded sRGB frame [0, 1] -> the EXR's values: its linear light (srgb-linear), that in
    AP1 (acescg, Bradford D65 -> ACES white) or ACEScct codes of it (acescct)."""
    linear = srgb_eotf(frame)
    if colorspace == "srgb-linear":
        return linear
    if colorspace not in EXR_COLORSPACES:
        raise ValueError(f"EXR colourspace {colorspace!r} is not one of {', '.join(EXR_COLORSPACES)}")
    acescg = apply_matrix(rgb_to_rgb_matrix(BT709, AP1), linear)
    return acescg if colorspace == "acescg" else acescct_encode(acescg)
