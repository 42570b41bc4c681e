"""Strict weight loading: every tensor of a component file lands in the model, or we say which did not.

A pack component file holds keys `<component>.<module path>` in MLX layout. Quantized Linear layers
are recognised by a `<path>.scales` tensor next to `<path>.weight`; bits and group size follow from
the shapes (packed weight (O, I*bits/32), scales (O, I/group)), so no constant is assumed.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten


class PackError(ValueError):
    """A pack that cannot be loaded: the message names the file and the key."""


def read_safetensors(path: str | Path) -> dict[str, mx.array]:
    """All tensors of one safetensors file, lazily mapped by MLX."""
    path = Path(path)
    if not path.is_file():
        raise PackError(f"{path}: file missing")
    return dict(mx.load(str(path)))


def strip_prefix(weights: dict[str, mx.array], prefix: str, *, file: str) -> dict[str, mx.array]:
    """Drop the component prefix; a key without it is an error naming key and file."""
    out = {}
    want = prefix.rstrip(".") + "."
    for key, value in weights.items():
        if not key.startswith(want):
            raise PackError(f"{file}: key {key!r} does not start with the component prefix {want!r}")
        out[key[len(want):]] = value
    return out


def _quantization_of(path: str, module: nn.Module, weights: dict[str, mx.array]) -> dict | bool:
    scales = weights.get(f"{path}.scales")
    if scales is None or not isinstance(module, nn.Linear):
        return False
    in_features = module.weight.shape[1]
    packed = weights[f"{path}.weight"].shape[1]
    bits = packed * 32 // in_features
    group_size = in_features // scales.shape[1]
    return {"group_size": group_size, "bits": bits, "mode": "affine"}


def quantize_like(model: nn.Module, weights: dict[str, mx.array]) -> None:
    """Swap every Linear that the weights store quantized for a QuantizedLinear of the same shape."""
    nn.quantize(model, class_predicate=lambda path, m: _quantization_of(path, m, weights))


def apply_weights(model: nn.Module, weights: dict[str, mx.array], *, file: str) -> nn.Module:
    """Load `weights` (prefix already stripped) into `model` strictly.

    Missing keys, unexpected keys and shape mismatches raise PackError naming the key and file.
    Attribute names starting with `_` are invisible to MLX, so callers rename those before this.
    """
    quantize_like(model, weights)
    expected = dict(tree_flatten(model.parameters()))
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise PackError(f"{file}: missing tensor {missing[0]!r}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""))
    unexpected = sorted(set(weights) - set(expected))
    if unexpected:
        raise PackError(f"{file}: unexpected tensor {unexpected[0]!r}" + (f" (+{len(unexpected) - 1} more)" if len(unexpected) > 1 else ""))
    for key, value in weights.items():
        want = expected[key].shape
        if tuple(value.shape) != tuple(want):
            raise PackError(f"{file}: tensor {key!r} has shape {tuple(value.shape)}, model expects {tuple(want)}")
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    return model


def quantize_weights(model: nn.Module, *, bits: int, group_size: int, predicate) -> None:
    """Quantize the Linear layers of a built model for which `predicate(path)` holds (pack writing)."""
    nn.quantize(
        model,
        class_predicate=lambda path, m: isinstance(m, nn.Linear)
        and predicate(path)
        and m.weight.shape[1] % group_size == 0
        and {"group_size": group_size, "bits": bits, "mode": "affine"},
    )
