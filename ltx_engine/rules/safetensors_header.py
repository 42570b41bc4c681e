"""A safetensors file's header (the JSON after its 8-byte length), read without its tensors.

One reader for the loader, block streaming and the LoRA checks the coordinator runs at submit (which
may not import a model library, so this module is pure): the same bound on the header and the same
one-line refusal for a file that is no safetensors.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from ltx_engine.rules.errors import PackError

MAX_HEADER = 100 * 2**20


def read_raw_header(path: str | Path, label: str | None = None,
                    error: type[PackError] = PackError) -> tuple[int, dict]:
    """(the header's byte count, the header with its `__metadata__`); `error` names `label` (default
    the path) in one line for a file that cannot be read as safetensors."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > MAX_HEADER:
                raise ValueError(f"header of {size} bytes")
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error) as exc:
        raise error(f"{label or path}: not a readable safetensors file ({exc})") from exc
    if not isinstance(header, dict):
        raise error(f"{label or path}: not a readable safetensors file (header is not a JSON object)")
    return size, header


def file_config(path: str | Path) -> dict:
    """The model config a file carries in its `config` metadata (JSON; the diffusion decoder's `vae`)."""
    _, header = read_raw_header(path)
    text = (header.get("__metadata__") or {}).get("config")
    try:
        return json.loads(text) if text else {}
    except ValueError as exc:
        raise PackError(f"{path}: its `config` metadata is not JSON ({exc})") from exc
