"""Fusing a LoRA into transformer weights on load: `W += strength * B @ A`, in float32, cast back.

A dev-only pack (only `transformer-dev.safetensors`) renders the distilled graph with the distilled
LoRA that mlx-forge bundles beside it (`ltx-2.3-22b-distilled-lora-384[-1.1].safetensors`, synced
as-is from Lightricks). Its keys keep the reference names, `diffusion_model.<module>.lora_A.weight`
(rank, in) and `.lora_B.weight` (out, rank); the transformer's own `sanitize` (the renames mlx-forge
applies: `to_out.0` -> `to_out`, `ff.net.*` -> `ff.proj_*`, `linear_1` -> `linear1`) names the target. Only bf16/float weights are fused; a quantized target is
refused, because dequantize-fuse-requantize loses most of a small LoRA's update.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from ltx_engine.loader import PackError

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
        if f"{base}.scales" in weights:
            raise PackError(f"{file}: tensor {target!r} is quantized; fusing {lora_file} needs bf16 dev weights")
        w = weights[target]
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] != a.shape[0] or (b.shape[0], a.shape[1]) != tuple(w.shape):
            raise PackError(f"{lora_file}: key {key!r} has factors {tuple(b.shape)} @ {tuple(a.shape)}, "
                            f"target {target!r} is {tuple(w.shape)}")
        delta = strength * (b.astype(mx.float32) @ a.astype(mx.float32))
        out[target] = (w.astype(mx.float32) + delta).astype(w.dtype)
    return out
