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
from protos.spec import RenderSpec, SpecError


def cli_spec(*, prompt: str, height: int, width: int, frames: int | None, frame_rate: float, seed: int, pack: str,
             image: tuple[Path, int, float] | None = None, no_audio: bool = False, stage2_tiles: str | None = None,
             tile_overlap: int = 5, stage2_sigmas: str | None = None, temporal_upscalings: int = 0,
             decode_tiles: str = "auto", exr: Path | None = None, text_encoder: str | None = None,
             data: Path | None = None, detailing_lora: str | None = None, detailing_strength: float = 0.5,
             priority: int | None = None, notify: str | None = None, image_blob: str | None = None,
             lora_fields: dict | None = None, guidance: dict | None = None,
             ) -> tuple[RenderSpec, np.ndarray | None]:
    """The typed spec of the command's options and the decoded image, if any; one line, exit 2, for a
    value the spec refuses. `image_blob`: stands in for the image without reading it (`farm plan`)."""
    raw, pixels = common.render_spec(prompt, height, width, frames, frame_rate, seed, pack,
                                     None if image_blob else image, no_audio)
    if image_blob is not None and image is not None:
        raw["image"] = {"blob": image_blob, "frame": int(image[1]), "strength": float(image[2])}
    raw |= common.advanced_spec(stage2_tiles, tile_overlap, stage2_sigmas, temporal_upscalings, decode_tiles, exr)
    raw |= common.detailing_spec(detailing_lora, detailing_strength)
    raw |= lora_fields or {}  # --lora / --lora-mode, resolved by farm_cli.loras
    raw["text_encoder"] = common.text_encoder_choice(pack, text_encoder, data)
    raw["priority"] = priority
    raw |= {k: v for k, v in (guidance or {}).items() if v is not None}  # the guided recipe's knobs
    if notify:
        if not notify.startswith(("http://", "https://")):
            fail(f"--notify {notify!r}: give an http:// or https:// URL")
        raw["notify"] = notify
    try:
        return RenderSpec.from_dict(raw), pixels
    except SpecError as exc:
        fail(str(exc))
