"""One copy of each model per process, keyed by (pack, component), built through the strict loader.

Workers keep models warm between tasks; when a budget is set, the least recently used models that the
current task does not need are dropped first.
"""

from __future__ import annotations

import gc
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ltx_engine.loading.loader import apply_weights
from ltx_engine.loading.model_classes import COMPONENTS, model_class
from ltx_engine.loading.pack import WeightPack
from ltx_engine.lora.dev_distilled import DIT_NAMES
from ltx_engine.rules.text_encoders import is_gemma4_tower

# Every builder reads `pack.tensors(component)`, which a pack folder and a single-file checkpoint both
# return in the model's own keys and layout, so one path builds either.


def _model(component: str) -> Callable[[WeightPack], nn.Module]:
    """A builder for a weight component: its class from its config (or, for a class with
    `from_weights`, from its config and the sizes its tensors fix), then the strict load."""

    def build(pack: WeightPack) -> nn.Module:
        if component in DIT_NAMES and getattr(pack, "streamed", False):  # blocks bound one at a time
            from ltx_engine.loading.streaming import build_streamed

            return build_streamed(pack, component)
        cls, cfg, tensors = model_class(component), pack.component_config(component), pack.tensors(component)
        from_weights = getattr(cls, "from_weights", None)
        model = cls.from_config(cfg) if from_weights is None else from_weights(cfg, tensors)
        return apply_weights(model, tensors, file=pack.file_label(component))

    return build


class EncoderFolder:
    """A text encoder folder as the registry keys it: one copy whichever pack's prompts it encodes."""

    def __init__(self, folder: Path):
        self.text_encoder_dir = Path(folder)

    @property
    def key(self) -> str:
        return str(self.text_encoder_dir.resolve())


def _text_encoder(pack: WeightPack):
    """Gemma 3 (an mlx-lm folder) or an LTX-2.5 pack's Gemma 4 tower, whichever the folder holds."""
    if is_gemma4_tower(pack.text_encoder_dir):
        from ltx_engine.models.gemma4 import Gemma4Tower

        return Gemma4Tower.load(pack.text_encoder_dir)
    from ltx_engine.models.text_encoder import TextEncoder

    return TextEncoder.load(pack.text_encoder_dir)


def _audio_encoder(pack: WeightPack):
    """The audio VAE's encoder half, from the same `audio_vae` file as the decoder (whose
    `pack_to_model` drops `encoder.*`), so it reads the file's own keys."""
    from ltx_engine.loading.loader import PackError
    from ltx_engine.models.audio_encoder import AudioEncoder

    raw = getattr(pack, "raw_tensors", None)
    if raw is None:
        raise PackError(f"{pack.file_label('audio_vae')}: the audio encoder is read from pack folders only")
    weights = AudioEncoder.pack_to_model(raw("audio_vae"))
    return apply_weights(AudioEncoder.from_config(pack.config), weights, file=pack.file_label("audio_vae"))


BUILDERS: dict[str, Callable[[WeightPack], object]] = {
    **{component: _model(component) for component in COMPONENTS},
    "text_encoder": _text_encoder,
    "audio_encoder": _audio_encoder,  # (the `audio_encode` task)
}


def model_bytes(model: object) -> int:
    params = model.parameters() if isinstance(model, nn.Module) else getattr(model, "model", nn.Module()).parameters()
    return sum(v.nbytes for _, v in tree_flatten(params))


class ModelRegistry:
    """Process-wide models: built once, kept warm, evicted LRU-first past `budget_bytes`."""

    def __init__(self, budget_bytes: int | None = None):
        self.budget_bytes = budget_bytes
        self._models: OrderedDict[tuple[str, str], object] = OrderedDict()
        self._bytes: dict[tuple[str, str], int] = {}  # sized once at load, not on every task
        self.load_seconds = 0.0

    def get(self, pack: WeightPack, component: str) -> object:
        key = (pack.key, component)
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        start = time.perf_counter()
        model = BUILDERS[component](pack)
        self.load_seconds += time.perf_counter() - start
        self._models[key] = model
        self._bytes[key] = model_bytes(model)
        return model

    def retain(self, needed: Iterable[tuple[str, str]], incoming_bytes: int = 0) -> None:
        """Drop least-recently-used models not in `needed` while over budget, counting `incoming_bytes`
        of a model about to load (a text encoder, sized from its files) as already there."""
        if self.budget_bytes is None:
            return
        keep = set(needed)
        while sum(self._bytes.values()) + incoming_bytes > self.budget_bytes:
            victim = next((k for k in self._models if k not in keep), None)
            if victim is None:
                break
            del self._models[victim]
            del self._bytes[victim]
            gc.collect()
            mx.clear_cache()

    def has(self, key: tuple[str, str]) -> bool:
        return key in self._models

    def loaded_bytes(self) -> int:
        """Weight bytes of the models held warm now."""
        return sum(self._bytes.values())

    def loaded(self) -> list[str]:
        return [component for _, component in self._models]
