"""Fusing a LoRA into transformer weights on load: `W += strength * B @ A`, in float32, cast back.

A dev-only pack (only `transformer-dev.safetensors`) renders the distilled graph with the distilled
LoRA that mlx-forge bundles beside it (`ltx-2.3-22b-distilled-lora-384[-1.1].safetensors`, synced
as-is from Lightricks). Its keys keep the reference names, `diffusion_model.<module>.lora_A.weight`
(rank, in) and `.lora_B.weight` (out, rank); the transformer's own `sanitize` (the renames mlx-forge
applies: `to_out.0` -> `to_out`, `ff.net.*` -> `ff.proj_*`, `linear_1` -> `linear1`) names the target. bf16/float weights are fused in place; a quantized target is
dequantized, updated in float32 and requantized at the pack's own bits and group size (read from the
packed shapes), as the MLX port fuses LoRAs into q8 / q4 packs; the requantization costs part of a small
LoRA's update (the error is of the order of one quantization step per group).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

from ltx_engine.loader import PackError, read_header

LORA_PREFIX = "diffusion_model."
_A, _B = ".lora_A.weight", ".lora_B.weight"


Rename = Callable[[dict], dict]


def _target(key: str, rename: Rename) -> str:
    """The pack weight a LoRA factor updates: `diffusion_model.x.lora_A.weight` -> `x.weight`, with the
    transformer's own reference -> pack renames (`rename`, the model's `sanitize`)."""
    name = key.removeprefix(LORA_PREFIX).removesuffix(_A) + ".weight"
    return next(iter(rename({f"model.diffusion_model.{name}": mx.array(0)})))


def lora_pairs(lora: dict[str, mx.array], rename: Rename, *, file: str) -> dict[str, tuple[mx.array, mx.array, str]]:
    """Target weight -> (A, B, the LoRA key naming it); any key that is not a factor, or an A without
    its B, is an error naming the key."""
    pairs: dict[str, tuple[mx.array, mx.array, str]] = {}
    for key in sorted(lora):
        if key.endswith(_B):
            continue
        if not key.endswith(_A):
            raise PackError(f"{file}: key {key!r} is not a LoRA factor (.lora_A.weight / .lora_B.weight)")
        b_key = key.removesuffix(_A) + _B
        if b_key not in lora:
            raise PackError(f"{file}: key {key!r} has no matching {b_key!r}")
        pairs[_target(key, rename)] = (lora[key], lora[b_key], key)
    orphans = sorted(k for k in lora if k.endswith(_B) and k.removesuffix(_B) + _A not in lora)
    if orphans:
        raise PackError(f"{file}: key {orphans[0]!r} has no matching lora_A")
    return pairs


def fuse_lora(weights: dict[str, mx.array], lora: dict[str, mx.array], strength: float, rename: Rename, *,
              file: str, lora_file: str) -> dict[str, mx.array]:
    """`weights` (pack keys, prefix stripped) with every LoRA target updated; the rest untouched."""
    out = dict(weights)
    for target, (a, b, key) in lora_pairs(lora, rename, file=lora_file).items():
        if target not in weights:
            raise PackError(f"{lora_file}: key {key!r} targets {target!r}, which {file} does not have")
        base = target.removesuffix(".weight")
        quantized = f"{base}.scales" in weights
        w = _dequantized(weights, base, a.shape[-1]) if quantized else weights[target].astype(mx.float32)
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] != a.shape[0] or (b.shape[0], a.shape[1]) != tuple(w.shape):
            raise PackError(f"{lora_file}: key {key!r} has factors {tuple(b.shape)} @ {tuple(a.shape)}, "
                            f"target {target!r} is {tuple(w.shape)}")
        fused = w + strength * (b.astype(mx.float32) @ a.astype(mx.float32))
        if quantized:
            out.update(_requantized(fused, weights, base))
        else:
            out[target] = fused.astype(weights[target].dtype)
    return out


def quantization_of(packed: mx.array, scales: mx.array, in_features: int) -> tuple[int, int]:
    """(bits, group size) of an MLX-quantized Linear from its shapes: (O, I*bits/32) uint32, (O, I/group)."""
    bits, group = packed.shape[-1] * 32 // in_features, in_features // scales.shape[-1]
    if bits not in (2, 3, 4, 5, 6, 8) or group * scales.shape[-1] != in_features:
        raise PackError(f"weight {tuple(packed.shape)} with scales {tuple(scales.shape)} is not an MLX quantization "
                        f"of {in_features} inputs")
    return bits, group


def _dequantized(weights: dict[str, mx.array], base: str, in_features: int) -> mx.array:
    packed, scales, biases = weights[f"{base}.weight"], weights[f"{base}.scales"], weights[f"{base}.biases"]
    bits, group = quantization_of(packed, scales, in_features)
    return mx.dequantize(packed, scales, biases, group_size=group, bits=bits).astype(mx.float32)


def _requantized(fused: mx.array, weights: dict[str, mx.array], base: str) -> dict[str, mx.array]:
    """The fused float32 weight quantized back at the target's own bits and group size."""
    scales = weights[f"{base}.scales"]
    bits, group = quantization_of(weights[f"{base}.weight"], scales, fused.shape[-1])
    packed, new_scales, biases = mx.quantize(fused, group_size=group, bits=bits)
    return {f"{base}.weight": packed, f"{base}.scales": new_scales.astype(scales.dtype),
            f"{base}.biases": biases.astype(weights[f"{base}.biases"].dtype)}


DEFAULT_REFERENCE_DOWNSCALE = 2  # upstream DFR's default for its x2 detailing IC-LoRA


def reference_downscale(path: str | Path) -> int:
    """The IC-LoRA's target / reference spatial ratio from its metadata (`reference_downscale_factor`),
    else 2, as upstream's DFR reads its detailing LoRA."""
    metadata = read_header(path)[1]
    if "reference_downscale_factor" in metadata:
        return int(metadata["reference_downscale_factor"])
    return DEFAULT_REFERENCE_DOWNSCALE


class WithLoras:
    """A pack seen with LoRAs fused into its DiT, under its own registry key: a worker pays the fusion
    once and keeps the fused DiT warm beside the plain one (DFR's stage 2 vs its temporal rounds)."""

    def __init__(self, pack, loras: tuple[tuple[str, float], ...]):
        self.pack, self.loras = pack, tuple((str(n), float(s)) for n, s in loras)

    def __getattr__(self, name: str):
        return getattr(self.pack, name)

    @property
    def key(self) -> str:
        return self.pack.key + "|" + ",".join(f"{name}@{strength:g}" for name, strength in self.loras)

    def tensors(self, component: str) -> dict[str, mx.array]:
        return self.pack.tensors(component, loras=self.loras)
