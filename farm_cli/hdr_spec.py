"""Issue #29's flags as spec fields: `--exr-colorspace NAME`, `--auto-duration MIN:MAX` and `--hdr`.

The planner checks what they mean (a colourspace the assembler writes, a range inside the duration
head's); here only the shape of MIN:MAX is read, one line and exit 2 when it is not two numbers.
"""

from __future__ import annotations

from farm_cli.common import fail


def hdr_fields(exr_colorspace: str | None, auto_duration: str | None, hdr: bool = False) -> dict:
    """The spec fields of the flags (left out when not given; --hdr: the HLG master too)."""
    out: dict = {"exr_colorspace": exr_colorspace} if exr_colorspace else {}
    if hdr:
        out["hdr"] = True
    if auto_duration:
        low, sep, high = auto_duration.partition(":")
        try:
            out["auto_duration"] = [float(low), float(high)] if sep else None
        except ValueError:
            out["auto_duration"] = None
        if out["auto_duration"] is None:
            fail(f"--auto-duration {auto_duration!r} is not MIN:MAX seconds, e.g. 2:8")
    return out


def decoder_fields(video_decoder: str | None) -> dict:
    """`--video-decoder conv|diffusion` as the spec's `video_decoder` (left out when not given); the
    planner refuses diffusion on a 2.3 pack or a pack without vae_decoder_av."""
    return {"video_decoder": video_decoder} if video_decoder else {}
def dfr_fields(dfr: bool, spatial_upscalings: int = 1) -> dict:
    """`--dfr` / `--spatial-upscalings N` as spec fields (left out at their defaults; the planner checks N)."""
    out: dict = {"dfr": True} if dfr else {}
    if spatial_upscalings != 1:
        out["spatial_upscalings"] = spatial_upscalings
    return out
