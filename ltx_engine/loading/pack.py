"""A weight pack: the folder layout mlx-forge writes for LTX-2 (or the tiny pack with the same layout).

A pack is opened from a local folder or a Hugging Face repo id (resolved from the local cache first,
so a worker runs offline once the pack is there); `open_pack` also accepts an official single-file
checkpoint (`ltx_engine.loading.checkpoint`). Both kinds hand the registry each component's tensors already in
the model's own keys and layout, so `ltx_engine.loading.registry` has one build path for either.
"""

from __future__ import annotations

import json
import logging
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import mlx.core as mx

from ltx_engine.loading.loader import (
    PackError,
    check_safetensors,
    read_header,
    read_safetensors,
    strip_prefix,
)
from ltx_engine.loading.model_classes import model_class
from ltx_engine.lora.lora import LoraInput, fuse_loras
from ltx_engine.rules.components import (
    PARTS,
    TEXT_ENCODER,
    Found,
    Layout,
    get_line,
    missing_line,
    resolve_files,
)
from ltx_engine.rules.generation import detect_generation
from ltx_engine.rules.safetensors_header import file_config
from ltx_engine.rules.text_encoders import LM_HEAD, is_gemma4_tower, lm_head_problem

if TYPE_CHECKING:
    from ltx_engine.loading.checkpoint import CheckpointPack

DISTILLED_LORA_STRENGTH = 1.0  # the distilled LoRA at full strength turns the dev DiT into the distilled one
log = logging.getLogger(__name__)


class WeightPack(Protocol):
    """What the registry and the runner read from a pack, whatever its files look like."""

    root: Path

    @property
    def key(self) -> str: ...

    @property
    def config(self) -> dict: ...

    @property
    def text_encoder_dir(self) -> Path: ...

    @property
    def generation(self) -> str: ...

    def has(self, component: str) -> bool: ...

    def components(self) -> list[str]: ...

    def missing(self, component: str) -> str: ...

    def component_config(self, component: str) -> dict: ...

    def file_label(self, component: str) -> str: ...

    def tensors(self, component: str) -> dict[str, mx.array]: ...


def open_pack(ref: str | Path) -> Pack | CheckpointPack:
    """A `.safetensors` file is an official single-file checkpoint; anything else a pack folder or repo id."""
    if str(ref).endswith(".safetensors"):
        from ltx_engine.loading.checkpoint import CheckpointPack

        return CheckpointPack(ref)
    return Pack(ref)


def hf_snapshot(folder: Path) -> Path | None:
    """A Hugging Face cache repo folder (`models--owner--name`) -> the snapshot `refs/main` names."""
    ref = folder / "refs" / "main"
    if not folder.name.startswith("models--") or not ref.is_file():
        return None
    snapshot = folder / "snapshots" / ref.read_text().strip()
    return snapshot if snapshot.is_dir() else None


def resolve_pack_path(ref: str | Path) -> Path:
    """A local folder as is; otherwise a Hugging Face repo id, from the local cache when present."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return hf_snapshot(path) or path
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
    """An opened pack: its files resolved into components (newest versions, shards merged), configs,
    and lazily read component tensors. Unknown files are skipped with one warning line; a missing
    optional component refuses only the tasks that need it (`has`, `missing`)."""

    def __init__(self, root: str | Path):
        self.root = resolve_pack_path(root)
        self.layout = self._scan()
        self._broken: dict[str, str] = {}
        for component, found in self.layout.found.items():
            try:
                for name in found.files:
                    check_safetensors(self.root / name)
            except PackError as exc:
                self._broken[component] = str(exc)
        if not (self.root / "embedded_config.json").is_file():
            raise PackError(f"{self.root / 'embedded_config.json'}: file missing from pack")

    def __repr__(self) -> str:
        return f"Pack({str(self.root)!r})"

    @property
    def key(self) -> str:
        """Identity of the pack for caches: its resolved folder."""
        return str(self.root.resolve())

    def _scan(self) -> Layout:
        """Resolve the folder's files (HF cache symlinks followed; a link whose blob is absent is no
        file); what the farm does not know is named in one warning line and otherwise ignored."""
        entries = sorted(self.root.iterdir())
        files = [p.name for p in entries if p.is_file()]
        folders = [p.name + "/" for p in entries if p.is_dir() and p.name not in (TEXT_ENCODER, ".cache", ".git")]
        layout = resolve_files(files)
        skipped = layout.unknown + [f"{n} (incomplete shard set)" for n in layout.incomplete] + folders
        if skipped:
            log.warning("pack %s: skipping %d file(s) the farm does not know: %s", self.root, len(skipped),
                        ", ".join(skipped))
        return layout

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
    def generation(self) -> str:
        """The LTX generation ("2.3" / "2.5"): mlx-forge's recorded `model_version`, else the DiT's keys."""
        versions = [self._json(n).get("model_version") for n in ("config.json", "split_model.json")
                    if (self.root / n).is_file()]
        dit = self.layout.found.get("transformer") or self.layout.found.get("transformer_dev")
        keys = [k for name in (dit.files if dit else ()) for k in read_header(self.root / name)[0]]
        return detect_generation(versions, self.config.get("transformer", {}), keys)

    @cached_property
    def quantization(self) -> dict | None:
        return self._json("quantize_config.json") if (self.root / "quantize_config.json").is_file() else None

    def _usable(self, component: str) -> bool:
        return component in self.layout.found and component not in self._broken

    def _dev_fusion(self) -> str | None:
        """None when the distilled DiT can be the dev DiT with the distilled LoRA fused; else why not."""
        if not self._usable("transformer_dev"):
            return missing_line("transformer", str(self.root))
        dev = self.layout.found["transformer_dev"]
        if not self._usable("distilled_lora"):
            return (f"{self.root / dev.files[0]} is a dev DiT and the pack has no distilled LoRA "
                    f"({PARTS['distilled_lora'].example}) to fuse into it")
        return None  # a quantized dev DiT fuses too: dequantize, add, requantize (`ltx_engine.lora.lora`)

    @cached_property
    def _fused_dev(self) -> bool:
        return not self._usable("transformer") and self._dev_fusion() is None

    def has(self, component: str) -> bool:
        if component == TEXT_ENCODER:
            return (self.text_encoder_dir / "config.json").is_file() or is_gemma4_tower(self.text_encoder_dir)
        if component == LM_HEAD:  # its text encoder writes (`--enhance-prompt`)
            return self.has(TEXT_ENCODER) and lm_head_problem(self.text_encoder_dir) is None
        if component == "transformer" and self._fused_dev:
            return True
        return self._usable(component)

    def components(self) -> list[str]:
        """Every component this pack can serve (what a worker advertises for it)."""
        return [c for c in (*PARTS, TEXT_ENCODER, LM_HEAD) if self.has(c)]

    def problem(self, component: str) -> str | None:
        """Why a component the pack has files for cannot be served (a broken file, a dev DiT that cannot
        stand in for the distilled one), in one line; None when it serves or is simply absent."""
        if component in self._broken:
            return self._broken[component]
        if component == "transformer" and not self.has(component) and self._usable("transformer_dev"):
            return f"{self._dev_fusion()}: get the distilled DiT with `{get_line('transformer', str(self.root))}`"
        return None

    def missing(self, component: str) -> str:
        """The one line that says why `component` cannot be served: its problem, or that it is absent
        with the command that gets it."""
        return self.problem(component) or missing_line(component, str(self.root))

    def _found(self, component: str) -> Found:
        if not self.has(component) or component not in self.layout.found:
            raise PackError(self.missing(component))
        return self.layout.found[component]

    def component_config(self, component: str) -> dict:
        """A component's own `*_config.json` (the upsamplers have one); the diffusion decoder's is in its
        file's `config` metadata."""
        if component == "vae_decoder_av":
            return file_config(self.root / self._found(component).files[0])
        if component not in PARTS or not PARTS[component].config:
            return self.config
        return self._json(self._found(component).config_file)

    def file_label(self, component: str) -> str:
        if component == "transformer" and self._fused_dev:
            component = "transformer_dev"
        found = self.layout.found.get(component)
        return str(self.root / (found.files[0] if found else PARTS[component].example))

    def _read(self, component: str) -> dict[str, mx.array]:
        """A component's file tensors, prefix stripped, shards merged (pack key names)."""
        found = self._found(component)
        out: dict[str, mx.array] = {}
        for name in found.files:
            out.update(strip_prefix(read_safetensors(self.root / name), found.prefix, file=str(self.root / name)))
        return out

    def raw_tensors(self, component: str) -> dict[str, mx.array]:
        """A component's file tensors in the file's own key names (the audio encoder reads the
        `audio_vae` file this way: its decoder's `pack_to_model` drops the encoder's keys)."""
        return self._read(component)

    def tensors(self, component: str, loras: tuple[tuple[str, float], ...] = ()) -> dict[str, mx.array]:
        """A component's tensors in its model's keys and layout: prefix stripped (shards merged), then
        one LoRA set fused (summed in float32, each weight requantized once, as upstream's stage 2 fuses
        the distilled LoRA with the user's in one `apply_loras`): the distilled LoRA at strength 1 for a
        dev-only pack's DiT, then `loras` (file names in the pack, strengths; the DiT's factors into the
        DiT, connector factors into the connector; e.g. DFR's detailing IC-LoRA); then the model's
        `pack_to_model` where the file's names differ from the model's."""
        sanitize = model_class("transformer").sanitize
        fused_dev = component == "transformer" and self._fused_dev
        out = self._read("transformer_dev" if fused_dev else component)
        distilled = self.layout.found["distilled_lora"].files[0] if fused_dev else None
        lora_set = [self._lora(distilled, DISTILLED_LORA_STRENGTH)] if distilled else []
        if component in ("transformer", "transformer_dev", "connector"):  # the dev DiT: guided passes (#23)
            lora_set += [self._lora(name, strength) for name, strength in loras]
        if lora_set:
            dit = "transformer" if component == "transformer_dev" else component  # the dev DiT takes the DiT's factors
            out = fuse_loras(out, lora_set, sanitize, file=self.file_label(component), component=dit)
        to_model = getattr(model_class(component), "pack_to_model", None)
        return to_model(out) if to_model is not None else out

    def stream_parts(self, component: str = "transformer", loras: tuple[tuple[str, float], ...] = ()) -> dict:
        """What block streaming reads instead of `tensors`: the component's files (paths), their key
        prefix, the label errors name, and the LoRA set `tensors` would fuse (distilled LoRA first)."""
        fused_dev = component == "transformer" and self._fused_dev
        found = self._found("transformer_dev" if fused_dev else component)
        lora_set = [self._lora(self.layout.found["distilled_lora"].files[0], DISTILLED_LORA_STRENGTH)] if fused_dev else []
        lora_set += [self._lora(name, strength) for name, strength in loras]
        return {"files": [self.root / name for name in found.files], "prefix": found.prefix,
                "label": self.file_label(component), "loras": lora_set}

    def _lora(self, name: str, strength: float) -> LoraInput:
        path = self.root / name
        if not path.is_file():
            raise PackError(f"{path}: no such LoRA file in pack {self.root.name!r}")
        return LoraInput(read_safetensors(path), strength, str(path))

    @property
    def text_encoder_dir(self) -> Path:
        """The Gemma checkpoint the pack's prompts are encoded with: a `text_encoder/` folder (Gemma 3,
        mlx-lm format), else the pack itself when it holds an LTX-2.5 Gemma 4 tower at its top."""
        folder = self.root / TEXT_ENCODER
        return self.root if not folder.is_dir() and is_gemma4_tower(self.root) else folder
