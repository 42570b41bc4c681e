"""Unfused LoRAs: run-time adapters `y = x·Wᵀ (+ bias) + Σ s·((x·Aᵀ)·Bᵀ)` on a built model's Linear layers.

The MLX port's `LTX2_LORA_MODE=unfused` (`attach_loras`): the weights stay as stored (a q8 / q4
layer keeps its packed weight, so nothing is lost to requantization) and every targeted Linear /
QuantizedLinear is wrapped. The factors of several LoRAs on one layer are stacked along the rank:
A = [A₁; A₂; …] (r₁+r₂+…, in), B = [s₁·c₁·B₁, s₂·c₂·B₂, …] (out, r₁+r₂+…) in float32 (c: the alpha
scale), so one adapter costs two thin matmuls per forward. `detach_loras` puts the original layers
back, the same objects. Which modules a set targets and the refusals are `ltx_engine.lora.lora`'s own
(`check_loras`): the same set fused or attached touches the same layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from ltx_engine.lora.lora import LoraInput, Rename, Update, check_loras


class LoraAdapter(nn.Module):
    """A Linear (float or quantized) plus its stacked LoRA update; the base layer is untouched."""

    def __init__(self, base: nn.Module, a: mx.array, b: mx.array):
        super().__init__()
        self.base, self.lora_a, self.lora_b = base, a, b

    def __call__(self, x: mx.array) -> mx.array:
        y = self.base(x)
        return y + ((x @ self.lora_a.T) @ self.lora_b.T).astype(y.dtype)


def stacked_factors(updates: Sequence[Update]) -> dict[str, tuple[mx.array, mx.array]]:
    """Pack weight -> (A (R, in), B (out, R)) float32, every update of the set stacked in set order,
    the strength and alpha scale folded into B."""
    by_target: dict[str, list[Update]] = {}
    for u in updates:
        by_target.setdefault(u.target, []).append(u)
    out = {}
    for target, group in by_target.items():
        a = mx.concatenate([u.factor.a.astype(mx.float32) for u in group], axis=0)
        b = mx.concatenate([(u.strength * u.factor.scale) * u.factor.b.astype(mx.float32) for u in group], axis=1)
        out[target] = (a, b)
    return out


def _parent_and_name(model: nn.Module, path: str) -> tuple[object, str]:
    *parents, name = path.split(".")
    node: object = model
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else getattr(node, part)
    return node, name


def _get(node: object, name: str) -> object:
    return node[int(name)] if isinstance(node, list) else getattr(node, name)


def _set(node: object, name: str, value: nn.Module) -> None:
    if isinstance(node, list):
        node[int(name)] = value
    else:
        setattr(node, name, value)


def adapter_factors(weights: dict[str, mx.array], loras: Sequence[LoraInput], rename: Rename, *, file: str,
                    component: str = "transformer") -> dict[str, tuple[mx.array, mx.array]]:
    """Module path -> its stacked (A, B): the set resolved and checked against `weights` (the component's
    tensors, lazy is fine) as fusion does."""
    factors = stacked_factors(check_loras(weights, loras, rename, file=file, component=component))
    return {target.removesuffix(".weight"): ab for target, ab in factors.items()}


def wrap_layers(model: nn.Module, factors: dict[str, tuple[mx.array, mx.array]], *, file: str) -> list[str]:
    """Wrap each module path of `factors` (paths in `model`) in a `LoraAdapter`; returns the paths."""
    for path, (a, b) in factors.items():
        parent, name = _parent_and_name(model, path)
        layer = _get(parent, name)
        if not isinstance(layer, (nn.Linear, nn.QuantizedLinear)):
            raise TypeError(f"{file}: {path} is a {type(layer).__name__}, not a Linear layer to adapt")
        _set(parent, name, LoraAdapter(layer, a, b))
    return list(factors)


def attach_loras(model: nn.Module, weights: dict[str, mx.array], loras: Sequence[LoraInput], rename: Rename, *,
                 file: str, component: str = "transformer") -> list[str]:
    """Wrap every layer the set targets in a `LoraAdapter` (the model's module paths are its pack keys);
    `weights` (the component's tensors, lazy is fine) resolve and check the set as fusion does. Returns
    the adapted module paths. A layer that is already an adapter is refused (detach first). A model
    whose blocks are bound at run time (a streamed DiT, `attach_adapters`) takes the factors and wraps
    each block's layers as it binds it."""
    factors = adapter_factors(weights, loras, rename, file=file, component=component)
    attach = getattr(model, "attach_adapters", None)
    if attach is not None:
        attach(factors, file=file)
        return list(factors)
    return wrap_layers(model, factors, file=file)


def has_adapters(model: nn.Module) -> bool:
    """Whether `model` has a set attached (a streamed DiT holds its blocks' factors until it binds them)."""
    return bool(getattr(model, "adapters", None)) or any(isinstance(m, LoraAdapter) for _, m in model.named_modules())


def detach_loras(model: nn.Module) -> int:
    """Every adapter replaced by the layer it wraps (the original object); returns how many."""
    found = [path for path, module in model.named_modules() if isinstance(module, LoraAdapter)]
    for path in found:
        parent, name = _parent_and_name(model, path)
        _set(parent, name, _get(parent, name).base)
    return len(found)
