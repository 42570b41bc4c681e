"""The render spec from the command line, built in one place for `render`, `submit` and `plan`.

Why one place: the three commands used to build it each their own way, and their defaults drifted
(`submit` and `plan` sent frames=25, so an LTX-2.5 pack's DurationHead never picked the length). An
option left out is None here, so the spec record's own default stands (`protos.spec.RenderSpec`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from farm_cli import common
from farm_cli.common import fail
from farm_cli.images import cli_images
from protos.spec import RenderSpec, SpecError


def cli_spec(*, prompt: str, height: int, width: int, frames: int | None, frame_rate: float, seed: int, pack: str,
             image: list[tuple[Path, str, float]] | None = None, no_audio: bool = False, stage2_tiles: str | None = None,
             tile_overlap: int = 5, stage2_sigmas: str | None = None, temporal_upscalings: int = 0,
             decode_tiles: str = "auto", exr: Path | None = None, text_encoder: str | None = None,
             data: Path | None = None, detailing_lora: str | None = None, detailing_strength: float = 0.5,
             priority: int | None = None, notify: str | None = None, image_blob: str | None = None,
             image_binding: list[str] | None = None, image_crf: list[int] | None = None,
             num_generated_keyframes: int = 0, lora_fields: dict | None = None, guidance: dict | None = None,
             sparse_attention: str | None = None, compute_dtype: str | None = None, hdr_fields: dict | None = None,
             dfr_fields: dict | None = None,
             media_fields: dict | None = None,
             ) -> tuple[RenderSpec, list[np.ndarray]]:
    """The typed spec of the command's options and the decoded images (one per --image, in order); one
    line, exit 2, for a value the spec refuses. `image_blob`: the images are not decoded, each file's
    sha256 stands in for its blob (`farm plan`)."""
    raw, _ = common.render_spec(prompt, height, width, frames, frame_rate, seed, pack, None, no_audio)
    raw["images"], pixels = cli_images(image, image_binding, image_crf, read=image_blob is None)
    raw["num_generated_keyframes"] = num_generated_keyframes
    raw |= common.advanced_spec(stage2_tiles, tile_overlap, stage2_sigmas, temporal_upscalings, decode_tiles, exr)
    raw |= common.detailing_spec(detailing_lora, detailing_strength)
    raw |= lora_fields or {}  # --lora / --lora-mode, resolved by farm_cli.loras
    raw |= hdr_fields or {}  # issue #29: --exr-colorspace / --auto-duration (farm_cli.hdr_spec)
    raw |= dfr_fields or {}  # issue #29: --dfr / --spatial-upscalings (farm_cli.hdr_spec.dfr_fields)
    raw |= media_fields or {}  # issue #24: --audio / --audio-start, resolved by farm_cli.media
    raw["text_encoder"] = common.text_encoder_choice(pack, text_encoder, data)
    raw["priority"] = priority
    raw |= {k: v for k, v in (guidance or {}).items() if v is not None}  # the guided recipe's knobs
    raw |= forward_spec(sparse_attention, compute_dtype)
    if notify:
        if not notify.startswith(("http://", "https://")):
            fail(f"--notify {notify!r}: give an http:// or https:// URL")
        raw["notify"] = notify
    try:
        return RenderSpec.from_dict(raw), pixels
    except SpecError as exc:
        fail(str(exc))


def forward_spec(sparse_attention: str | None, compute_dtype: str | None) -> dict:
    """Issue #26: --sparse-attention TAUS (comma-separated) and --compute-dtype as spec fields."""
    out: dict = {"compute_dtype": compute_dtype} if compute_dtype else {}
    if sparse_attention:
        try:
            out["sparse_attention"] = [float(x) for x in sparse_attention.split(",")]
        except ValueError:
            fail(f"--sparse-attention {sparse_attention!r} is not a comma-separated list of taus, e.g. 1.0,1.25,1.5")
    return out
