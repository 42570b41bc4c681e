"""The HDR IC-LoRA's two ends as pure numpy: SDR / EXR pixels -> the working space the HDR LoRA reads ->
the VAE's [-1, 1]; the decoded [0, 1] working codes -> scene-linear (HLG master) and the EXR's values.

Where the rules come from (ltx-core 1.0.0 has no HDR module):
- **Working spaces** (upstream `ltx_core.hdr.HDRTransfer`, main): `acescct` (the 2.5 SDR-to-HDR LoRA,
  AMPAS S-2016-001 on AP1 linear, the MLX port's `hdr-ic-lora`, which follows upstream v1.4) and
  `logc3` (ARRI LogC3 EI 800 on Rec.709 linear, upstream 1.2.0's 2.3 HDR LoRA and its default when a
  LoRA's metadata says only `use_hdr_transform`). Compress clamps the linear input at 0 and its output
  to [0, 1]; decompress clamps its input to [0, 1] first; linear results are clamped at 0.
- **SDR input** (MLX port `load_video_as_hdr_conditioning`): uint8 / 255 -> the sRGB EOTF when the clip
  is display-encoded (`--input-colorspace srgb_gamma`, the default; `srgb` takes the codes as linear)
  -> Rec.709 -> AP1 -> ACEScct -> x 2 - 1. Upstream 1.2.0's LogC3 path instead feeds the clamped codes
  straight (`compress_ldr`, the identity), which is what `logc3` does here.
- **EXR input** (`load_exr_as_hdr_conditioning`): `srgb_linear` / `acescg` plates are compressed from
  their primaries, `acescct` plates are already codes (clamped).
- **Output** (`encode_hdr_outputs`): the decode's [-1, 1] -> [0, 1] (`from_vae_range`), decompressed;
  the HLG master always gets Rec.709 scene-linear (`coordinator/assemble/hdr_master.py` writes it); EXR frames
  get ACEScct codes (`acescct`), else scene-linear in the colourspace's primaries.
Matrices: `ltx_engine.rules.color`'s Bradford-adapted BT.709 <-> AP1 (upstream's 5-decimal table and the
MLX port's colour-science one agree with it to < 1e-4; tests/parity/test_hdr_ic_lora_math.py).
"""

from __future__ import annotations

import numpy as np

from ltx_engine.rules import color

F32 = np.float32
ACESCCT, LOGC3 = "acescct", "logc3"
TRANSFERS = (ACESCCT, LOGC3)
INPUT_COLORSPACES = ("srgb_gamma", "srgb", "acescg", "acescct")  # the MLX port's --input-colorspace
EXR_INPUT = {"srgb": "srgb-linear", "acescg": "acescg", "acescct": "acescct"}  # an EXR folder's plates

# ARRI LogC3 (EI 800), upstream `ltx_core.hdr` verbatim.
LOGC3_A, LOGC3_B, LOGC3_C, LOGC3_D = 5.555556, 0.052272, 0.247190, 0.385537
LOGC3_E, LOGC3_F, LOGC3_CUT = 5.367655, 0.092809, 0.010591


class HdrInputError(ValueError):
    """An input the HDR path cannot take (one line)."""


def _native(transfer: str) -> color.Primaries:
    """The primaries a transfer's curve is defined on (where decompress lands)."""
    if transfer not in TRANSFERS:
        raise HdrInputError(f"HDR transfer {transfer!r} is not one of {', '.join(TRANSFERS)}")
    return color.AP1 if transfer == ACESCCT else color.BT709


def convert(src: color.Primaries, dst: color.Primaries, rgb: np.ndarray) -> np.ndarray:
    rgb = np.asarray(rgb, F32)
    return rgb if src == dst else color.apply_matrix(color.rgb_to_rgb_matrix(src, dst), rgb)


def compress(linear: np.ndarray, transfer: str) -> np.ndarray:
    """Linear light in the transfer's native primaries [0, inf) -> working codes [0, 1]."""
    x = np.maximum(np.asarray(linear, F32), F32(0.0))
    if transfer == ACESCCT:
        return np.clip(color.acescct_encode(x), F32(0.0), F32(1.0))
    _native(transfer)
    log = F32(LOGC3_C) * np.log10(F32(LOGC3_A) * x + F32(LOGC3_B)) + F32(LOGC3_D)
    return np.clip(np.where(x >= F32(LOGC3_CUT), log, F32(LOGC3_E) * x + F32(LOGC3_F)), 0.0, 1.0).astype(F32)


def decompress(codes: np.ndarray, transfer: str) -> np.ndarray:
    """Working codes -> linear light in the native primaries (codes clamped to [0, 1] first)."""
    c = np.clip(np.asarray(codes, F32), F32(0.0), F32(1.0))
    if transfer == ACESCCT:
        return color.acescct_decode(c)
    _native(transfer)
    cut = F32(LOGC3_E * LOGC3_CUT + LOGC3_F)
    log = (np.power(F32(10.0), (c - F32(LOGC3_D)) / F32(LOGC3_C)) - F32(LOGC3_B)) / F32(LOGC3_A)
    return np.where(c >= cut, log, (c - F32(LOGC3_F)) / F32(LOGC3_E)).astype(F32)


def to_working(linear: np.ndarray, primaries: color.Primaries, transfer: str) -> np.ndarray:
    """Scene-linear RGB in `primaries` -> the transfer's [0, 1] codes (rotated into its primaries)."""
    return compress(np.maximum(convert(primaries, _native(transfer), linear), F32(0.0)), transfer)


def to_linear(codes: np.ndarray, transfer: str, primaries: color.Primaries = color.BT709) -> np.ndarray:
    """[0, 1] codes -> scene-linear RGB in `primaries`, clamped at 0."""
    return np.maximum(convert(_native(transfer), primaries, decompress(codes, transfer)), F32(0.0))


def to_vae_range(codes: np.ndarray) -> np.ndarray:
    """[0, 1] codes -> the VAE's [-1, 1]; upstream's `to_vae_range` refuses rather than clamps."""
    x = np.asarray(codes, F32)
    if x.size and (float(x.min()) < 0.0 or float(x.max()) > 1.0):
        raise HdrInputError(f"working codes must lie in [0, 1], got [{float(x.min())}, {float(x.max())}]")
    return (x * F32(2.0) - F32(1.0)).astype(F32)


def from_vae_range(pixels: np.ndarray) -> np.ndarray:
    """The decoder's [-1, 1] -> [0, 1] codes (clamped), as upstream's `from_vae_range`."""
    return np.clip((np.asarray(pixels, F32) + F32(1.0)) / F32(2.0), F32(0.0), F32(1.0))


def sdr_working(
    rgb8: np.ndarray, transfer: str = ACESCCT, input_colorspace: str = "srgb_gamma"
) -> np.ndarray:
    """(..., 3) uint8 SDR frames -> [0, 1] working codes (see the module docstring for the order)."""
    if input_colorspace not in ("srgb_gamma", "srgb"):
        raise HdrInputError(
            f"an SDR clip's --input-colorspace is srgb_gamma or srgb, not {input_colorspace!r}"
        )
    ldr = np.clip(np.asarray(rgb8, F32) / F32(255.0), F32(0.0), F32(1.0))
    if transfer == LOGC3:  # upstream 1.2.0: `compress_ldr` is the identity clamp
        return ldr
    linear = color.srgb_eotf(ldr) if input_colorspace == "srgb_gamma" else ldr
    return to_working(linear, color.BT709, transfer)


def exr_working(plates: np.ndarray, exr_colorspace: str, transfer: str = ACESCCT) -> np.ndarray:
    """(..., 3) float EXR values in `exr_colorspace` (srgb-linear, acescg, acescct) -> working codes."""
    if exr_colorspace == "acescct":
        return np.clip(np.asarray(plates, F32), F32(0.0), F32(1.0))
    if exr_colorspace not in color.EXR_COLORSPACES:
        raise HdrInputError(
            f"EXR colourspace {exr_colorspace!r} is not one of {', '.join(color.EXR_COLORSPACES)}"
        )
    return to_working(plates, color.exr_primaries(exr_colorspace), transfer)


def outputs(
    decoded: np.ndarray, transfer: str = ACESCCT, exr_colorspace: str = "acescg"
) -> dict[str, np.ndarray]:
    """(F, H, W, 3) decoded [0, 1] codes -> `linear_709` (what the HLG master writer takes) and `exr`
    (the EXR frames' values in `exr_colorspace`: ACEScct codes, or scene-linear in its primaries)."""
    codes = np.clip(np.asarray(decoded, F32), F32(0.0), F32(1.0))
    linear_709 = to_linear(codes, transfer, color.BT709)
    if exr_colorspace == "acescct" and transfer == ACESCCT:
        exr = codes
    elif exr_colorspace == "acescct":
        exr = color.acescct_encode(to_linear(codes, transfer, color.AP1))
    elif exr_colorspace in color.EXR_COLORSPACES:
        exr = to_linear(codes, transfer, color.exr_primaries(exr_colorspace))
    else:
        raise HdrInputError(
            f"EXR colourspace {exr_colorspace!r} is not one of {', '.join(color.EXR_COLORSPACES)}"
        )
    return {"linear_709": linear_709, "exr": exr}
