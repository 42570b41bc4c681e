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

from ltx_engine.rules.errors import PackError  # noqa: F401 - defined where pure modules can raise it too
from ltx_engine.rules.safetensors_header import read_raw_header


def _header(path: Path) -> tuple[int, dict]:
    return read_raw_header(path)


def read_header(path: str | Path) -> tuple[list[str], dict[str, str]]:
    """Tensor names and string metadata of a safetensors file, without reading any tensor."""
    _, header = _header(Path(path))
    meta = header.pop("__metadata__", None) or {}
    return sorted(header), meta


def check_safetensors(path: str | Path) -> list[str]:
    """Tensor names of a file whose header parses and whose tensors all lie inside the file: a
    truncated or corrupted download is named here (file and key), before anything loads it."""
    path = Path(path)
    size, header = _header(path)
    header.pop("__metadata__", None)
    data = path.stat().st_size - 8 - size
    for key, info in header.items():
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not isinstance(offsets, list) or len(offsets) != 2:
            raise PackError(f"{path}: tensor {key!r} has no data offsets (corrupted header)")
        if int(offsets[1]) > data:
            raise PackError(f"{path}: tensor {key!r} ends at byte {offsets[1]} of {data} (file truncated)")
    return sorted(header)


def read_safetensors(path: str | Path) -> dict[str, mx.array]:
    """All tensors of one safetensors file, lazily mapped by MLX."""
    path = Path(path)
    if not path.is_file():
        raise PackError(f"{path}: file missing")
    check_safetensors(path)
    try:
        return dict(mx.load(str(path)))
    except (RuntimeError, ValueError) as exc:
        raise PackError(f"{path}: not a readable safetensors file ({exc})") from exc


def strip_prefix(weights: dict[str, mx.array], prefix: str, *, file: str) -> dict[str, mx.array]:
    """Drop the component prefix; a key without it is an error naming key and file."""
    out = {}
    want = prefix.rstrip(".") + "."
    for key, value in weights.items():
        if not key.startswith(want):
            raise PackError(f"{file}: key {key!r} does not start with the component prefix {want!r}")
        out[key[len(want):]] = value
    return out


def _quantization_of(path: str, module: nn.Module, weights: dict[str, mx.array], _file: str = "") -> dict | bool:
    scales = weights.get(f"{path}.scales")
    if scales is None or not isinstance(module, nn.Linear):
        return False
    out_features, in_features = module.weight.shape
    weight, biases = weights.get(f"{path}.weight"), weights.get(f"{path}.biases")
    if weight is None or biases is None or weight.ndim != 2 or scales.ndim != 2 or scales.shape[1] == 0:
        raise PackError(f"{_file}: quantized {path!r} lacks a 2-D .weight, .scales or .biases")
    bits, group_size = weight.shape[1] * 32 // in_features, in_features // scales.shape[1]
    consistent = (weight.dtype == mx.uint32 and bits in (2, 3, 4, 5, 6, 8) and weight.shape[1] * 32 == bits * in_features
                  and group_size * scales.shape[1] == in_features and weight.shape[0] == out_features
                  and tuple(scales.shape) == (out_features, in_features // group_size)
                  and tuple(biases.shape) == tuple(scales.shape))
    if not consistent:
        raise PackError(f"{_file}: quantized tensor {path + '.scales'!r} {tuple(scales.shape)} does not match "
                        f"{path + '.weight'!r} {tuple(weight.shape)} for a ({out_features}, {in_features}) Linear")
    return {"group_size": group_size, "bits": bits, "mode": "affine"}


def quantize_like(model: nn.Module, weights: dict[str, mx.array], file: str = "") -> None:
    """Swap every Linear that the weights store quantized for a QuantizedLinear of the same shape; a
    quantized tensor whose shapes do not fit the Linear is an error naming file and key."""
    nn.quantize(model, class_predicate=lambda path, m: _quantization_of(path, m, weights, file))


def apply_weights(model: nn.Module, weights: dict[str, mx.array], *, file: str) -> nn.Module:
    """Load `weights` (prefix already stripped) into `model` strictly.

    Missing keys, unexpected keys and shape mismatches raise PackError naming the key and file.
    Attribute names starting with `_` are invisible to MLX, so callers rename those before this.
    """
    quantize_like(model, weights, file)
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
