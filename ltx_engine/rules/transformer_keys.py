"""The DiT's key renames, pure (no model library): reference checkpoint names <-> pack key names.

`models.transformer.LTXModel.sanitize` applies them to tensors on load; the LoRA checks the coordinator
runs at submit (`ltx_engine.rules.lora_check`) apply them to names read from safetensors headers.
"""

from __future__ import annotations

_RENAMES = (
    (".to_out.0.", ".to_out."),
    (".ff.net.0.proj.", ".ff.proj_in."),
    (".ff.net.2.", ".ff.proj_out."),
    (".audio_ff.net.0.proj.", ".audio_ff.proj_in."),
    (".audio_ff.net.2.", ".audio_ff.proj_out."),
    (".linear_1.", ".linear1."),
    (".linear_2.", ".linear2."),
)
OTHER_COMPONENTS = ("video_embeddings_connector.", "audio_embeddings_connector.")
REFERENCE_PREFIX = "model.diffusion_model."


def reference_name(pack_key: str) -> str:
    """A pack key back in the reference checkpoint's names (the inverse of `sanitize`'s renames), so
    a LoRA written with underscores for dots (kohya) can be matched against the pack's modules."""
    k = "." + pack_key
    for old, new in reversed(_RENAMES):
        k = k.replace(new, old)
    return k[1:]


def pack_key(reference_key: str) -> str | None:
    """A reference state-dict key in the pack's names; None for a key of another component."""
    k = reference_key.removeprefix(REFERENCE_PREFIX)
    if k.startswith(OTHER_COMPONENTS):
        return None
    k = "." + k
    for old, new in _RENAMES:
        k = k.replace(old, new)
    return k[1:]


def pack_keys(weights: dict) -> dict:
    """`sanitize`'s renames on the keys only (values untouched): what a header-only check renames with."""
    return {new: value for key, value in weights.items() if (new := pack_key(key)) is not None}
