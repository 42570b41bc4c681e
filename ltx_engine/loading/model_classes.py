"""Which model class builds each weight component, imported on demand.

Its own module so both kinds of pack read it without importing each other: `ltx_engine.loading.pack` (a pack
folder, which opens checkpoints too) and `ltx_engine.loading.checkpoint` (a single-file checkpoint) each turn
file keys into model keys through the class found here (`pack_to_model` / `sanitize`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import mlx.nn as nn

_MODELS = "ltx_engine.models."


# The model class (`module:Class`) of each weight component: its `pack_to_model` / `sanitize` turn file
# keys into model keys. Which files hold a component is `ltx_engine.rules.components`' business.
MODELS: dict[str, str] = {
    "transformer": "transformer:LTXModel",
    "transformer_dev": "transformer:LTXModel",
    "connector": "connector:TextConnector",
    "vae_decoder": "video_vae:VideoDecoder",
    "vae_encoder": "video_vae:VideoEncoder",
    "audio_vae": "audio_vae:AudioDecoder",
    "vocoder": "vocoder:Vocoder",
    "spatial_upscaler": "upsampler:LatentUpsampler",
    "temporal_upscaler": "upsampler:LatentUpsampler",
    "duration_head": "duration_head:DurationHead",
    "vae_decoder_av": "diffusion_decoder:DiffusionVideoDecoder",
}
COMPONENTS = tuple(MODELS)


def model_class(component: str) -> type[nn.Module]:
    """The model class of a component, imported on demand (loading a VAE never imports the DiT)."""
    module, name = MODELS[component].split(":")
    return getattr(importlib.import_module(_MODELS + module), name)
