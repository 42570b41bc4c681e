"""An official Lightricks single-file PyTorch checkpoint, opened as a pack.

The file holds every component under the reference's prefixes (`model.diffusion_model.*`, `vae.*`,
`audio_vae.*`, `vocoder.*`, `text_embedding_projection.*`) and its config as JSON in the safetensors
metadata under "config" (what ltx_core's `SafetensorsModelStateDictLoader.metadata` reads). Keys are
routed to components by prefix as mlx-forge splits them, then each model's `sanitize` applies the
renames and channels-last transposes the MLX packs were made with, so the registry builds the same
models from either kind of pack. The latent upsamplers are separate official files with their own
config in metadata; the Gemma text encoder is a separate folder.
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from os.path import commonprefix
from pathlib import Path

import mlx.core as mx

from ltx_engine.loading.loader import PackError, read_header, read_safetensors
from ltx_engine.loading.model_classes import model_class
from ltx_engine.rules.generation import detect_generation
from ltx_engine.rules.text_encoders import LM_HEAD, lm_head_problem

GEMMA_ENV = "LTX_GEMMA_DIR"
_VIDEO_CONNECTOR = "model.diffusion_model.video_embeddings_connector."
_AUDIO_CONNECTOR = "model.diffusion_model.audio_embeddings_connector."
_V1_CONNECTOR = "model.diffusion_model.embeddings_connector."  # LTX-2.0's single connector
_VAE_STATS = "vae.per_channel_statistics."

# Component -> ordered (checkpoint prefix, replacement); the first matching prefix wins and None drops
# the key. The replacements mirror the reference's own key filters (VAE_DECODER_COMFY_KEYS_FILTER, ...),
# then each model's `sanitize` does the rest (e.g. the BWE wrapper's inner `vocoder.`).
ROUTES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "transformer": (
        (_VIDEO_CONNECTOR, None), (_AUDIO_CONNECTOR, None), (_V1_CONNECTOR, None), ("model.diffusion_model.", ""),
    ),
    "connector": (
        (_VIDEO_CONNECTOR, "video_embeddings_connector."),
        (_AUDIO_CONNECTOR, "audio_embeddings_connector."),
        ("text_embedding_projection.", "text_embedding_projection."),
    ),
    "vae_decoder": (("vae.decoder.", ""), (_VAE_STATS, "per_channel_statistics.")),
    "vae_encoder": (("vae.encoder.", ""), (_VAE_STATS, "per_channel_statistics.")),
    "audio_vae": (("audio_vae.", ""),),
    "vocoder": (("vocoder.", ""),),
}
SHARED_PREFIXES = (_VAE_STATS,)  # in both VAE components; neither is present on the statistics alone
UPSAMPLER_PATTERNS = {
    "spatial_upscaler": "*spatial-upscaler-x2*.safetensors",
    "temporal_upscaler": "*temporal-upscaler-x2*.safetensors",
}
def metadata_config(path: Path) -> dict:
    """The JSON config an official file keeps in its metadata under "config"."""
    _, meta = read_header(path)
    if "config" not in meta:
        raise PackError(f"{path}: no 'config' in the safetensors metadata (not an official LTX-2 file)")
    try:
        return json.loads(meta["config"])
    except json.JSONDecodeError as exc:
        raise PackError(f"{path}: metadata 'config' is not JSON ({exc})") from exc


def is_checkpoint(path: Path) -> bool:
    """A `.safetensors` file whose metadata config has a `transformer` section (not an upsampler)."""
    if path.suffix != ".safetensors" or not path.is_file():
        return False
    try:
        return "transformer" in metadata_config(path)
    except PackError:
        return False


def route(key: str, component: str) -> str | None:
    """The name a checkpoint key gets in `component`'s state dict, or None if it is not the component's."""
    for prefix, replacement in ROUTES[component]:
        if key.startswith(prefix):
            return None if replacement is None else replacement + key[len(prefix):]
    return None


def find_upsamplers(checkpoint: Path) -> dict[str, Path]:
    """Official upsampler files next to the checkpoint; of several, the one sharing the longest name
    prefix with the checkpoint (its model family), then the highest version."""
    found = {}
    for component, pattern in UPSAMPLER_PATTERNS.items():
        candidates = sorted(checkpoint.parent.glob(pattern))
        if candidates:
            found[component] = max(candidates, key=lambda p: (len(commonprefix([p.name, checkpoint.name])), p.name))
    return found


class CheckpointPack:
    """A single-file checkpoint with the registry's pack interface; tensors come out in model layout."""

    quantization = None  # official checkpoints are not MLX-quantized

    def __init__(self, path: str | Path, upsamplers: dict[str, Path] | None = None,
                 text_encoder_dir: str | Path | None = None):
        self.path = self.root = Path(path).expanduser()
        if not self.path.is_file():
            raise PackError(f"{self.path}: no such checkpoint file")
        keys, _ = read_header(self.path)
        self._routes = {c: {k: name for k in keys if (name := route(k, c)) is not None} for c in ROUTES}
        self.upsamplers = {**find_upsamplers(self.path), **{c: Path(p) for c, p in (upsamplers or {}).items()}}
        unknown = set(self.upsamplers) - set(UPSAMPLER_PATTERNS)
        if unknown:
            raise PackError(f"{self.path}: unknown upsampler component(s) {sorted(unknown)}")
        self._text_encoder_dir = Path(text_encoder_dir) if text_encoder_dir else None
        for component in ROUTES:
            if not self.has(component):
                prefixes = ", ".join(p + "*" for p, r in ROUTES[component] if r is not None)
                raise PackError(f"{self.path}: no {component} tensors ({prefixes}) in checkpoint")

    def __repr__(self) -> str:
        return f"CheckpointPack({str(self.path)!r})"

    @property
    def key(self) -> str:
        """Identity for caches: the checkpoint and the upsampler files it was opened with."""
        parts = [str(self.path.resolve())] + [f"{c}={p.resolve()}" for c, p in sorted(self.upsamplers.items())]
        return "|".join(parts)

    @cached_property
    def config(self) -> dict:
        """The checkpoint's own config (the same dict an MLX pack keeps as `embedded_config.json`)."""
        return metadata_config(self.path)

    @cached_property
    def generation(self) -> str:
        """The LTX generation from the file's `model_version` metadata (what upstream reads), else its keys."""
        keys, meta = read_header(self.path)
        return detect_generation([meta.get("model_version")], self.config.get("transformer", {}), keys)

    def has(self, component: str) -> bool:
        if component in UPSAMPLER_PATTERNS:
            return component in self.upsamplers
        return any(not k.startswith(SHARED_PREFIXES) for k in self._routes.get(component, {}))

    def components(self) -> list[str]:
        """Every component this checkpoint (with its upsampler files and text encoder) can serve."""
        found = [c for c in (*ROUTES, *UPSAMPLER_PATTERNS) if self.has(c)]
        if self._text_encoder_dir or os.environ.get(GEMMA_ENV):
            found.append("text_encoder")
            if lm_head_problem(self.text_encoder_dir) is None:  # it writes (`--enhance-prompt`)
                found.append(LM_HEAD)
        return found

    def missing(self, component: str) -> str:
        """Why `component` cannot be served, in one line."""
        if component == "text_encoder":
            return f"{self.path}: a single-file checkpoint has no text encoder; set {GEMMA_ENV} to a Gemma 3 folder"
        if component in UPSAMPLER_PATTERNS:
            return f"{self.path.parent / UPSAMPLER_PATTERNS[component]}: no {component} file next to the checkpoint"
        return f"{self.file_label(component)}: no {component} tensors in checkpoint"

    def _upsampler_path(self, component: str) -> Path:
        if component not in self.upsamplers:
            raise PackError(f"{self.path.parent / UPSAMPLER_PATTERNS[component]}: no {component} file next to the "
                            "checkpoint (pass upsamplers={...})")
        return self.upsamplers[component]

    def component_config(self, component: str) -> dict:
        """An upsampler's config from its own file's metadata; the checkpoint's config otherwise."""
        if component in UPSAMPLER_PATTERNS:
            return metadata_config(self._upsampler_path(component))
        return self.config

    def file_label(self, component: str) -> str:
        """The file (and for the checkpoint, the component's key prefixes) that errors should name."""
        if component in UPSAMPLER_PATTERNS:
            return str(self._upsampler_path(component))
        prefixes = ", ".join(p + "*" for p, r in ROUTES.get(component, ()) if r is not None)
        return f"{self.path} [{prefixes}]"

    def tensors(self, component: str) -> dict[str, mx.array]:
        """A component's tensors in its model's keys and layout (the model's `sanitize`), read lazily."""
        if component in UPSAMPLER_PATTERNS:
            return model_class(component).sanitize(read_safetensors(self._upsampler_path(component)))
        if not self.has(component):
            raise PackError(f"{self.file_label(component)}: no {component} tensors in checkpoint")
        raw = read_safetensors(self.path)
        return model_class(component).sanitize({name: raw[key] for key, name in self._routes[component].items()})

    @property
    def text_encoder_dir(self) -> Path:
        """The Gemma checkpoint (mlx-lm format): given when opened, else `$LTX_GEMMA_DIR`."""
        folder = self._text_encoder_dir or (Path(os.environ[GEMMA_ENV]) if os.environ.get(GEMMA_ENV) else None)
        if folder is None:
            raise PackError(f"{self.path}: a single-file checkpoint has no text encoder; pass text_encoder_dir "
                            f"or set {GEMMA_ENV} to a Gemma 3 folder (mlx-lm format)")
        return folder.expanduser()
