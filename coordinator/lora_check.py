"""The user LoRAs of a submitted render checked against its pack before anything is queued (issue #22).

Each LoRA must have been uploaded (a blob) or be a file of the pack on the coordinator's shelf; its keys,
ranks and shapes must fit the pack's DiT (and connector): `ltx_engine.lora_check` reads both from their
safetensors headers, no weights, no model library. The first refusal is one line naming the LoRA and its
first bad key (a SpecError: exit 2 at the client, nothing queued). A pack the shelf does not hold (the
workers have it, the coordinator does not) cannot be read here: its LoRAs are checked by the worker that
runs the first DiT task, whose failure names the same key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from ltx_engine.components import resolve_files
from ltx_engine.lora_check import check_lora_files
from ltx_engine.lora_keys import LoraError
from ltx_engine.transformer_keys import pack_keys
from protos.fields import SpecError

LORA_COMPONENTS = ("transformer", "connector")


class Blobs(Protocol):
    def has(self, sha: str) -> bool: ...

    def path(self, sha: str) -> Path: ...


class Shelf(Protocol):
    def names(self) -> list[str]: ...

    def folder(self, pack: str) -> Path: ...


def _components(folder: Path) -> dict[str, tuple[list[Path], str]]:
    """The DiT's (a dev-only pack: the dev DiT's) and the connector's files with their key prefixes."""
    found = resolve_files(p.name for p in folder.iterdir() if p.is_file()).found
    out = {}
    for component in LORA_COMPONENTS:
        part = found.get(component) or (found.get("transformer_dev") if component == "transformer" else None)
        if part is not None:
            out[component] = ([folder / f for f in part.files], part.prefix + ".")
    return out


def _label(lora: Mapping) -> str:
    return str(lora.get("repo") or lora.get("name") or lora.get("file") or str(lora.get("blob"))[:12])


def check_render_loras(spec: Mapping, blobs: Blobs, shelf: Shelf | None) -> None:
    """SpecError (one line) for a LoRA of the render (its `--ic-lora` too) that was never uploaded, is not in the pack folder,
    or does not fit the pack; nothing when the render has none or the pack is not on the shelf."""
    loras = list(spec.get("loras") or ()) + ([spec["ic_lora"]] if spec.get("ic_lora") else [])  # issue #24
    if not loras:
        return
    for lora in loras:
        if lora.get("blob") and not blobs.has(str(lora["blob"])):
            raise SpecError(f"LoRA {_label(lora)} was never uploaded (blob {str(lora['blob'])[:12]})")
    pack = str(spec.get("pack"))
    if shelf is None or pack not in shelf.names():
        return
    folder = shelf.folder(pack)
    files = []
    for lora in loras:
        path = blobs.path(str(lora["blob"])) if lora.get("blob") else folder / str(lora["file"])
        if not path.is_file():
            raise SpecError(f"LoRA {_label(lora)}: pack {pack!r} has no such file")
        files.append((path, float(lora["strength"]), _label(lora)))
    try:
        check_lora_files(_components(folder), files, pack_keys)
    except LoraError as exc:
        raise SpecError(str(exc).splitlines()[0]) from exc
