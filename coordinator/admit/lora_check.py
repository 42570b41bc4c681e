"""A submitted render checked against its pack before anything is queued: its user LoRAs, and the
DiT's depth its guidance passes need (an STG block the model lacks would fail every worker).

Each LoRA must have been uploaded (a blob) or be a file of the pack on the coordinator's shelf; its keys,
ranks and shapes must fit the pack's DiT (and connector): `ltx_engine.rules.lora_check` reads both from their
safetensors headers, no weights, no model library. The first refusal is one line naming the LoRA and its
first bad key (a SpecError: exit 2 at the client, nothing queued). A pack the shelf does not hold (the
workers have it, the coordinator does not) cannot be read here: its LoRAs are checked by the worker that
runs the first DiT task, whose failure names the same key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ltx_engine.rules.components import resolve_files
from ltx_engine.rules.lora_check import check_lora_files, header_tensors
from ltx_engine.rules.lora_keys import LoraError
from ltx_engine.rules.transformer_keys import pack_keys
from protos.fields import SpecError
from protos.lora_set import missing_file

if TYPE_CHECKING:
    from coordinator.plan.resolved import RenderPlan

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


def check_render_loras(spec: RenderPlan, blobs: Blobs, shelf: Shelf | None) -> None:
    """SpecError (one line) for a LoRA of the render (its `--ic-lora` too) that was never uploaded, is not in the pack folder,
    or does not fit the pack; nothing when the render has none or the pack is not on the shelf."""
    loras = [lora.to_dict() for lora in spec.loras] + ([spec.ic_lora.to_dict()] if spec.ic_lora else [])
    if not loras:
        return
    for lora in loras:
        if lora.get("blob") and not blobs.has(str(lora["blob"])):
            raise SpecError(f"LoRA {_label(lora)} was never uploaded (blob {str(lora['blob'])[:12]})")
    pack = spec.pack
    if shelf is None or pack not in shelf.names():
        return
    folder = shelf.folder(pack)
    files = []
    for lora in loras:
        path = blobs.path(str(lora["blob"])) if lora.get("blob") else folder / str(lora["file"])
        if not path.is_file():
            raise SpecError(missing_file(str(lora["file"]), pack) if lora.get("file")
                            else f"LoRA {_label(lora)}: pack {pack!r} has no such file")
        files.append((path, float(lora["strength"]), _label(lora)))
    try:
        check_lora_files(_components(folder), files, pack_keys)
    except LoraError as exc:
        raise SpecError(str(exc).splitlines()[0]) from exc


def pack_dit_depth(folder: Path) -> int | None:
    """The pack's DiT block count, read from its safetensors headers (no weights); None when the folder
    holds no DiT file (a single-file checkpoint, a pack the caller cannot read)."""
    if not Path(folder).is_dir():
        return None
    part = _components(Path(folder)).get("transformer")
    if part is None:
        return None
    files, prefix = part
    blocks = set()
    for path in files:
        for key in header_tensors(path, prefix):
            if m := re.match(r"transformer_blocks\.(\d+)\.", key):
                blocks.add(int(m.group(1)))
    return max(blocks) + 1 if blocks else None


def check_render_depth(spec: RenderPlan, folder: Path | None) -> None:
    """SpecError (one line) when the render's guidance perturbs a block the pack's DiT does not have:
    the default STG block is the 22B's (28), which a smaller model (the tiny pack's 2) lacks."""
    from coordinator.plan.recipes import guided_stage

    depth = pack_dit_depth(folder) if folder is not None else None
    if depth is not None:
        guided_stage(spec, depth)


def shelf_folder(spec: RenderPlan, shelf: Shelf | None) -> Path | None:
    """The render's pack folder on the coordinator's shelf, or None when the shelf does not hold it."""
    pack = spec.pack
    return shelf.folder(pack) if shelf is not None and pack in shelf.names() else None
