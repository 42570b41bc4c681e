"""Fusing a set of LoRAs into a component's weights on load, as upstream's `apply_loras` does.

The set is (LoRA, strength) pairs: each LoRA's update of a weight is `strength * scale * B @ A` in
float32, the updates of every LoRA of the set are summed in float32 (in the set's order), and each
affected weight is written once: a float weight as `W + sum` cast back to its dtype, a quantized one
(MLX q8 / q4, packed uint32 + scales + biases) dequantized, added to in float32 and requantized ONCE
at its own bits and group size (read from the packed shapes), not once per LoRA, as the MLX port
fuses into q8 / q4 packs. Requantizing costs part of a small update (about one quantization step per
group); `ltx_engine.lora_adapters` is the unfused alternative that never touches W.

A dev-only pack (only `transformer-dev.safetensors`) renders the distilled graph with the distilled
LoRA fused at strength 1 (`Pack.tensors`). Key layouts and renames are `ltx_engine.lora_keys`; a
factor for a connector module is fused into the connector component. Refusals are `LoraError`
(a ValueError) lines naming the file and the first bad key.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from ltx_engine.loader import PackError, read_header
from ltx_engine.lora_keys import (
    Factor,
    LoraError,
    LoraKeyError,
    LoraModelError,
    LoraShapeError,
    component_of,
    read_factors,
)

__all__ = ["LoraError", "LoraKeyError", "LoraModelError", "LoraShapeError", "LoraInput", "check_loras",
           "apply_updates", "file_sha256", "fuse_lora", "fuse_loras", "lora_deltas", "lora_set_identity", "quantization_of", "reference_downscale", "WithLoras"]

Rename = Callable[[dict], dict]
MAX_LORAS = 8  # more than this in one set is refused (each adds a delta per weight and its load time)


@dataclass(frozen=True)
class LoraInput:
    """One LoRA of a set: its tensors (file keys), strength, and the label its errors name."""

    tensors: dict[str, mx.array]
    strength: float
    file: str


@dataclass(frozen=True)
class Update:
    """One factor resolved onto a pack weight: the target key and its (out, in) shape."""

    target: str
    factor: Factor
    strength: float
    quantized: bool


def _pack_target(module: str, component: str, rename: Rename) -> str:
    """The pack weight a reference module's factors update (the transformer's own renames)."""
    if component != "transformer":
        return module + ".weight"
    return next(iter(rename({f"model.diffusion_model.{module}.weight": mx.array(0)})))


def _reference_modules(weights: dict[str, mx.array], component: str) -> tuple[str, ...]:
    """The reference names of a component's modules (the connector's pack keys are those names)."""
    from ltx_engine.models.transformer import reference_name

    names = [reference_name(k) if component == "transformer" else k for k in weights if k.endswith(".weight")]
    return tuple(n.removesuffix(".weight") for n in names)


def quantization_of(packed: mx.array, scales: mx.array, in_features: int) -> tuple[int, int]:
    """(bits, group size) of an MLX-quantized Linear from its shapes: (O, I*bits/32) uint32, (O, I/group)."""
    bits, group = packed.shape[-1] * 32 // in_features, in_features // scales.shape[-1]
    if bits not in (2, 3, 4, 5, 6, 8) or group * scales.shape[-1] != in_features:
        raise PackError(f"weight {tuple(packed.shape)} with scales {tuple(scales.shape)} is not an MLX quantization "
                        f"of {in_features} inputs")
    return bits, group


def _weight_shape(weights: dict[str, mx.array], target: str, in_features: int) -> tuple[int, int] | None:
    """(out, in) of a float or quantized pack weight (a quantized one read at the LoRA's
    `in_features`); None when a quantized weight cannot have that many inputs."""
    base = target.removesuffix(".weight")
    w = weights[target]
    if f"{base}.scales" not in weights:
        return (int(w.shape[0]), int(w.shape[1])) if w.ndim == 2 else (int(w.shape[0]), -1)
    try:
        quantization_of(w, weights[f"{base}.scales"], in_features)
    except PackError:
        return None
    return int(w.shape[0]), in_features


def _check_shapes(update: Update, shape: tuple[int, int] | None, lora_file: str) -> None:
    a, b, key = update.factor.a, update.factor.b, update.factor.key
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise LoraShapeError(f"{lora_file}: key {key!r} has factors of {len(b.shape)} and {len(a.shape)} dims, not 2")
    if b.shape[1] != a.shape[0]:
        raise LoraShapeError(f"{lora_file}: key {key!r} has rank {a.shape[0]} in its down factor but {b.shape[1]} "
                             "in its up factor")
    if shape is None or (b.shape[0], a.shape[1]) != shape:
        want = "a quantized layer of other inputs" if shape is None else f"{shape[0]}x{shape[1]}"
        raise LoraModelError(f"{lora_file}: key {key!r} is for a {b.shape[0]}x{a.shape[1]} layer, "
                             f"{update.target!r} is {want}: a LoRA trained for another model (LTX-2.3 vs 2.5 widths?)")


def _resolve(weights: dict[str, mx.array], lora: LoraInput, rename: Rename, component: str,
             file: str) -> list[Update]:
    factors = read_factors(lora.tensors, file=lora.file, modules=_reference_modules(weights, component))
    updates = []
    for module, factor in factors.items():
        if component_of(module) != component:
            continue
        target = _pack_target(module, component, rename)
        if target not in weights:
            raise LoraKeyError(f"{lora.file}: key {factor.key!r} targets {target!r}, which {file} does not have")
        quantized = f"{target.removesuffix('.weight')}.scales" in weights
        update = Update(target, factor, lora.strength, quantized)
        _check_shapes(update, _weight_shape(weights, target, int(factor.a.shape[-1])), lora.file)
        updates.append(update)
    return updates


def check_loras(weights: dict[str, mx.array], loras: Sequence[LoraInput], rename: Rename, *, file: str,
                component: str = "transformer") -> list[Update]:
    """Every update the set makes on `weights` (one component), or the first refusal: too many LoRAs,
    a strength that is not finite, a key of no layout or no module, a rank or shape that does not fit.
    Reads shapes only (lazy arrays), so the farm can refuse at submit before any fusion."""
    if len(loras) > MAX_LORAS:
        raise LoraError(f"{len(loras)} LoRAs in one set; at most {MAX_LORAS}")
    updates: list[Update] = []
    for lora in loras:
        if not math.isfinite(lora.strength):
            raise LoraError(f"{lora.file}: strength {lora.strength} is not a finite number")
        updates += _resolve(weights, lora, rename, component, file)
    return updates


def lora_deltas(updates: Sequence[Update]) -> dict[str, mx.array]:
    """Pack weight -> the float32 sum, in set order, of `strength * scale * B @ A` over the set."""
    out: dict[str, mx.array] = {}
    for u in updates:
        coef = u.strength * u.factor.scale
        delta = coef * (u.factor.b.astype(mx.float32) @ u.factor.a.astype(mx.float32))
        out[u.target] = out[u.target] + delta if u.target in out else delta
    return out


def fuse_loras(weights: dict[str, mx.array], loras: Sequence[LoraInput], rename: Rename, *, file: str,
               component: str = "transformer") -> dict[str, mx.array]:
    """`weights` (pack keys, prefix stripped) with the set's summed update added to every weight it
    affects, each quantized weight requantized once; the rest untouched."""
    return apply_updates(weights, check_loras(weights, loras, rename, file=file, component=component))


def apply_updates(weights: dict[str, mx.array], updates: Sequence[Update]) -> dict[str, mx.array]:
    """`weights` with the checked `updates` summed and added (what `fuse_loras` does after its checks;
    block streaming applies one block's updates to that block's weights as it binds it)."""
    out = dict(weights)
    for target, delta in lora_deltas(updates).items():
        base = target.removesuffix(".weight")
        if f"{base}.scales" in weights:
            out.update(_requantized(_dequantized(weights, base, delta.shape[-1]) + delta, weights, base))
        else:
            out[target] = (weights[target].astype(mx.float32) + delta).astype(weights[target].dtype)
    return out


def fuse_lora(weights: dict[str, mx.array], lora: dict[str, mx.array], strength: float, rename: Rename, *,
              file: str, lora_file: str) -> dict[str, mx.array]:
    """One LoRA fused into the transformer's `weights` (the set of one)."""
    return fuse_loras(weights, [LoraInput(lora, strength, lora_file)], rename, file=file)


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


FUSED, UNFUSED = "fused", "unfused"
LORA_MODES = (FUSED, UNFUSED)


def lora_set_identity(entries: Sequence[tuple[str, float]], mode: str = FUSED) -> str:
    """A stable identity of a LoRA set for caching the model it makes: sha256 over the mode and the
    (file sha256, strength) pairs in set order (the float32 sum follows that order, so another order
    is another model, to the last bit). Strengths are written exactly (`float.hex`)."""
    if mode not in LORA_MODES:
        raise LoraError(f"LoRA mode {mode!r} is not one of {', '.join(LORA_MODES)}")
    parts = [mode]
    for sha, strength in entries:
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise LoraError(f"{sha!r} is not a sha256 hex digest")
        if not math.isfinite(strength):
            raise LoraError(f"LoRA {sha[:12]}: strength {strength} is not a finite number")
        parts.append(f"{sha}@{float(strength).hex()}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def file_sha256(path: str | Path) -> str:
    """The sha256 of a LoRA file (what workers cache it by), read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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

    def stream_parts(self, component: str = "transformer") -> dict:
        return self.pack.stream_parts(component, loras=self.loras)
