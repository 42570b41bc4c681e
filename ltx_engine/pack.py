"""A weight pack: the folder layout mlx-forge writes for LTX-2 (or the tiny pack with the same layout).

A pack is opened from a local folder or a Hugging Face repo id (resolved from the local cache first,
so a worker runs offline once the pack is there); `open_pack` also accepts an official single-file
checkpoint (`ltx_engine.checkpoint`). Both kinds hand the registry each component's tensors already in
the model's own keys and layout, so `ltx_engine.registry` has one build path for either.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import mlx.core as mx

from ltx_engine.loader import PackError, read_safetensors, strip_prefix

if TYPE_CHECKING:
    import mlx.nn as nn

    from ltx_engine.checkpoint import CheckpointPack

_MODELS = "ltx_engine.models."


@dataclass(frozen=True)
class Component:
    """One weight file of a pack: its file stem (shards allowed), the key prefix inside it, and the
    model class (`module:Class`) whose `pack_to_model` / `sanitize` turn file keys into model keys."""

    stem: str
    prefix: str
    model: str
    config_file: str | None = None


COMPONENTS: dict[str, Component] = {
    "transformer": Component("transformer-distilled", "transformer", "transformer:LTXModel"),
    "transformer_dev": Component("transformer-dev", "transformer", "transformer:LTXModel"),
    "connector": Component("connector", "connector", "connector:TextConnector"),
    "vae_decoder": Component("vae_decoder", "vae_decoder", "video_vae:VideoDecoder"),
    "vae_encoder": Component("vae_encoder", "vae_encoder", "video_vae:VideoEncoder"),
    "audio_vae": Component("audio_vae", "audio_vae", "audio_vae:AudioDecoder"),
    "vocoder": Component("vocoder", "vocoder", "vocoder:Vocoder"),
    "spatial_upscaler": Component(
        "spatial_upscaler_x2_v1_1", "spatial_upscaler_x2_v1_1", "upsampler:LatentUpsampler",
        "spatial_upscaler_x2_v1_1_config.json",
    ),
    "temporal_upscaler": Component(
        "temporal_upscaler_x2_v1_0", "temporal_upscaler_x2_v1_0", "upsampler:LatentUpsampler",
        "temporal_upscaler_x2_v1_0_config.json",
    ),
}
REQUIRED = ("transformer", "connector", "vae_decoder", "vae_encoder", "audio_vae", "vocoder", "spatial_upscaler")
METADATA_FILES = {"config.json", "embedded_config.json", "quantize_config.json", "split_model.json"}
TEXT_ENCODER_DIR = "text_encoder"


def model_class(component: str) -> type[nn.Module]:
    """The model class of a component, imported on demand (loading a VAE never imports the DiT)."""
    module, name = COMPONENTS[component].model.split(":")
    return getattr(importlib.import_module(_MODELS + module), name)


class WeightPack(Protocol):
    """What the registry and the runner read from a pack, whatever its files look like."""

    root: Path

    @property
    def key(self) -> str: ...

    @property
    def config(self) -> dict: ...

    @property
    def text_encoder_dir(self) -> Path: ...

    def has(self, component: str) -> bool: ...

    def component_config(self, component: str) -> dict: ...

    def file_label(self, component: str) -> str: ...

    def tensors(self, component: str) -> dict[str, mx.array]: ...


def open_pack(ref: str | Path) -> Pack | CheckpointPack:
    """A `.safetensors` file is an official single-file checkpoint; anything else a pack folder or repo id."""
    if str(ref).endswith(".safetensors"):
        from ltx_engine.checkpoint import CheckpointPack

        return CheckpointPack(ref)
    return Pack(ref)


def _shards(root: Path, stem: str) -> list[Path]:
    single = root / f"{stem}.safetensors"
    if single.is_file():
        return [single]
    return sorted(root.glob(f"{stem}-0*-of-0*.safetensors"))


def _known_weight_file(name: str) -> bool:
    stem = name.removesuffix(".safetensors")
    return any(stem == c.stem or stem.startswith(f"{c.stem}-0") for c in COMPONENTS.values())


def resolve_pack_path(ref: str | Path) -> Path:
    """A local folder as is; otherwise a Hugging Face repo id, from the local cache when present."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    if str(ref).count("/") != 1 or path.exists():
        raise PackError(f"{ref}: no such pack folder")
    try:
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(str(ref), local_files_only=True))
        except Exception:  # not cached yet: a real Mac downloads it once
            return Path(snapshot_download(str(ref)))
    except Exception as exc:  # noqa: BLE001 - one clear line for the user
        raise PackError(f"{ref}: pack not found locally and could not be downloaded ({type(exc).__name__})") from exc


class Pack:
    """An opened pack: configs and lazily read component tensors."""

    def __init__(self, root: str | Path):
        self.root = resolve_pack_path(root)
        self._check_files()

    def __repr__(self) -> str:
        return f"Pack({str(self.root)!r})"

    @property
    def key(self) -> str:
        """Identity of the pack for caches: its resolved folder."""
        return str(self.root.resolve())

    def _check_files(self) -> None:
        for path in sorted(self.root.iterdir()):
            if path.name.startswith(".") or path.name == TEXT_ENCODER_DIR or path.suffix == ".md":
                continue
            if path.suffix == ".safetensors" and not _known_weight_file(path.name):
                raise PackError(f"{path}: unknown weight file in pack (expected one of {sorted(c.stem for c in COMPONENTS.values())})")
            if path.suffix == ".json" and path.name not in METADATA_FILES and not path.name.endswith("_config.json"):
                raise PackError(f"{path}: unknown file in pack")
        for name in REQUIRED:
            if not _shards(self.root, COMPONENTS[name].stem):
                raise PackError(f"{self.root / (COMPONENTS[name].stem + '.safetensors')}: file missing from pack")
        for name in ("embedded_config.json",):
            if not (self.root / name).is_file():
                raise PackError(f"{self.root / name}: file missing from pack")

    def _json(self, name: str) -> dict:
        try:
            return json.loads((self.root / name).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise PackError(f"{self.root / name}: cannot read ({exc})") from exc

    @cached_property
    def config(self) -> dict:
        """The reference checkpoint's own config (`embedded_config.json`): every model size comes from here."""
        return self._json("embedded_config.json")

    @cached_property
    def quantization(self) -> dict | None:
        return self._json("quantize_config.json") if (self.root / "quantize_config.json").is_file() else None

    def has(self, component: str) -> bool:
        return bool(_shards(self.root, COMPONENTS[component].stem))

    def component_config(self, component: str) -> dict:
        """A component's own `*_config.json` (the upsamplers have one)."""
        name = COMPONENTS[component].config_file
        if name is None:
            return self.config
        return self._json(name)

    def file_label(self, component: str) -> str:
        return str(self.root / f"{COMPONENTS[component].stem}.safetensors")

    def tensors(self, component: str) -> dict[str, mx.array]:
        """A component's tensors in its model's keys and layout: prefix stripped (shards merged), then
        the model's `pack_to_model` where the file's names differ from the model's."""
        comp = COMPONENTS[component]
        shards = _shards(self.root, comp.stem)
        if not shards:
            raise PackError(f"{self.file_label(component)}: file missing from pack")
        out: dict[str, mx.array] = {}
        for shard in shards:
            out.update(strip_prefix(read_safetensors(shard), comp.prefix, file=str(shard)))
        to_model = getattr(model_class(component), "pack_to_model", None)
        return to_model(out) if to_model is not None else out

    @property
    def text_encoder_dir(self) -> Path:
        """The Gemma checkpoint (mlx-lm format) the pack's prompts are encoded with."""
        return self.root / TEXT_ENCODER_DIR
