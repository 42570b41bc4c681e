"""Fusing a set of LoRAs into a component's weights on load, as upstream's `apply_loras` does.

The set is (LoRA, strength) pairs: each LoRA's update of a weight is `strength * scale * B @ A` in
float32, the updates of every LoRA of the set are summed in float32 (in the set's order), and each
affected weight is written once: a float weight as `W + sum` cast back to its dtype, a quantized one
(MLX q8 / q4, packed uint32 + scales + biases) dequantized, added to in float32 and requantized ONCE
at its own bits and group size (read from the packed shapes), not once per LoRA, as the MLX port
fuses into q8 / q4 packs. Requantizing costs part of a small update (about one quantization step per
group); `ltx_engine.lora.lora_adapters` is the unfused alternative that never touches W.

A dev-only pack (only `transformer-dev.safetensors`) renders the distilled graph with the distilled
LoRA fused at strength 1 (`Pack.tensors`). Key layouts and renames are `ltx_engine.rules.lora_keys`; a
factor for a connector module is fused into the connector component. Refusals are `LoraError`
(a ValueError) lines naming the file and the first bad key.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx

from ltx_engine.loading.loader import read_header
from ltx_engine.rules.lora_check import MAX_LORAS, LoraInput, Rename, Update, check_loras, quantization_of  # noqa: F401
from ltx_engine.rules.lora_keys import LoraError, LoraKeyError, LoraModelError, LoraShapeError  # noqa: F401

__all__ = ["LoraError", "LoraKeyError", "LoraModelError", "LoraShapeError", "LoraInput", "check_loras",
           "apply_updates", "file_sha256", "fuse_lora", "fuse_loras", "lora_deltas", "lora_set_identity", "quantization_of", "reference_downscale", "WithLoras"]

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

    def stream_parts(self, component: str = "transformer", loras: tuple[tuple[str, float], ...] = ()) -> dict:
        """What block streaming reads: the set `tensors` fuses, this view's LoRAs then `loras` (a view over
        this one, e.g. DFR's detailing LoRA), in the order the fused sum takes them."""
        return self.pack.stream_parts(component, loras=self.loras + tuple(loras))
