"""The client's part of a render spec: the flags that name files or settings on this machine.

Why here: a flag's field (protos/spec.py) says how its text becomes the field, except where only the
client can: an image decoded, a LoRA or clip hashed (uploaded later), the config's text encoder, a hub
repo asked. Those fields say `client=NAME` and their reader is `CLIENT_READERS[NAME]`, run in this
order; what each returns is merged over the parsed flags, so a reader may also set fields it implies
(the HDR IC-LoRA render writes no audio and the HLG master).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from protos.spec import RenderSpec


@dataclass
class AskedRender:
    """What the options ask for: the typed spec, the decoded images, and the client files behind the
    spec's blobs (LoRAs, media) that a farm command uploads and `--local` reads where they are."""

    spec: RenderSpec | None = None
    pixels: list[np.ndarray] = field(default_factory=list)
    lora_files: dict[str, Path] = field(default_factory=dict)
    media_files: dict[str, Path] = field(default_factory=dict)

    def upload_to(self, coordinator: str, token: str | None) -> None:
        from farm_cli import loras, media

        loras.upload_to(self.lora_files, coordinator, token)
        media.upload_to(self.media_files, coordinator, token)


Reader = Callable[[dict, "AskedRender", "Path | None", bool], dict]


def _loras(asked: dict, out: AskedRender, data: Path | None, planning: bool) -> dict:
    """--lora SOURCE STRENGTH: each a blob of a file here (or the hub's), or a pack file name."""
    from farm_cli import loras

    chosen = loras.resolve(asked["lora"], asked["lora_mode"])
    out.lora_files = chosen.files
    return chosen.fields


def _media(asked: dict, out: AskedRender, data: Path | None, planning: bool) -> dict:
    """--audio, IC-LoRA control / Dub-It, retake / extend, the HDR IC-LoRA clip: blobs of files here."""
    from farm_cli import media

    chosen = media.resolve(asked["audio"], asked["audio_start"])
    media.add_control(chosen, asked["control_video"], asked["control_attention"], asked["ic_lora"], asked["dub"],
                      asked["control_stage2"], asked["control_mask"])
    media.resolve_clip(chosen, asked)
    media.add_hdr_clip(chosen, asked["hdr_ic_lora"], asked["no_keyframes"], asked["input_colorspace"])
    out.media_files = chosen.files
    return chosen.fields


def _images(asked: dict, out: AskedRender, data: Path | None, planning: bool) -> dict:
    """--image PATH FRAME STRENGTH with its binding and CRF; `farm plan` hashes the files, not decodes."""
    from farm_cli.images import cli_images

    entries, out.pixels = cli_images(asked["image"], asked["image_binding"], asked["image_crf"], read=not planning)
    return {"images": entries}


def _detailing(asked: dict, out: AskedRender, data: Path | None, planning: bool) -> dict:
    """--detailing-lora (a hub repo is asked here, before anything queues) with its strength."""
    from farm_cli.common import detailing_spec

    return detailing_spec(asked["detailing_lora"], asked["detailing_strength"])


def _text_encoder(asked: dict, out: AskedRender, data: Path | None, planning: bool) -> dict:
    """--text-encoder, else the pack's entry in the config file (a folder here as its absolute path)."""
    from farm_cli.common import text_encoder_choice

    return {"text_encoder": text_encoder_choice(asked["pack"], asked["text_encoder"], data)}


CLIENT_READERS: dict[str, Reader] = {
    "loras": _loras, "media": _media, "images": _images, "detailing": _detailing, "text_encoder": _text_encoder,
}
