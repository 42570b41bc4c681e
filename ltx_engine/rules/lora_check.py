"""The checks of a LoRA set against a pack, pure (shapes only, no model library), as upstream's
`apply_loras` resolves its keys: every factor to a pack weight, its rank and shapes held to that weight,
the set's size and strengths. `ltx_engine.lora.lora` fuses with them (lazy MLX arrays carry shapes too);
the coordinator runs them at submit on safetensors headers (`header_tensors`), so a LoRA that does not
fit the pack is refused in one line naming the file and the first bad key before anything is queued.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ltx_engine.rules.errors import PackError
from ltx_engine.rules.lora_keys import (
    Factor,
    LoraError,
    LoraKeyError,
    LoraModelError,
    LoraShapeError,
    Shaped,
    component_of,
    read_factors,
)
from ltx_engine.rules.safetensors_header import read_raw_header
from ltx_engine.rules.transformer_keys import reference_name

Rename = Callable[[dict], dict]
MAX_LORAS = 8  # more than this in one set is refused (each adds a delta per weight and its load time)


@dataclass(frozen=True)
class LoraInput:
    """One LoRA of a set: its tensors (file keys), strength, and the label its errors name."""

    tensors: dict
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
    return next(iter(rename({f"model.diffusion_model.{module}.weight": 0})))


def _reference_modules(weights: dict, component: str) -> tuple[str, ...]:
    """The reference names of a component's modules (the connector's pack keys are those names)."""
    names = [reference_name(k) if component == "transformer" else k for k in weights if k.endswith(".weight")]
    return tuple(n.removesuffix(".weight") for n in names)


def quantization_of(packed: Shaped, scales: Shaped, in_features: int) -> tuple[int, int]:
    """(bits, group size) of an MLX-quantized Linear from its shapes: (O, I*bits/32) uint32, (O, I/group)."""
    bits, group = packed.shape[-1] * 32 // in_features, in_features // scales.shape[-1]
    if bits not in (2, 3, 4, 5, 6, 8) or group * scales.shape[-1] != in_features:
        raise PackError(f"weight {tuple(packed.shape)} with scales {tuple(scales.shape)} is not an MLX quantization "
                        f"of {in_features} inputs")
    return bits, group


def _weight_shape(weights: dict, target: str, in_features: int) -> tuple[int, int] | None:
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


def _resolve(weights: dict, lora: LoraInput, rename: Rename, component: str,
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


def check_loras(weights: dict, loras: Sequence[LoraInput], rename: Rename, *, file: str,
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




# ------------------------------------------------------------------ header-only checks (the coordinator's)

_SCALARS = {"F64": ("<d", 8), "F32": ("<f", 4), "F16": ("<e", 2)}


@dataclass(frozen=True)
class HeaderTensor:
    """A tensor as a safetensors header describes it: its shape (and a scalar's value: an alpha)."""

    shape: tuple[int, ...]
    value: float | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def item(self) -> float:
        if self.value is None:
            raise LoraShapeError(f"a scalar of shape {self.shape} whose value cannot be read from the header")
        return self.value


def _scalar(f, info: dict, base: int) -> float | None:
    dtype, (start, end) = info.get("dtype"), info.get("data_offsets", (0, 0))
    f.seek(base + int(start))
    raw = f.read(int(end) - int(start))
    if dtype == "BF16" and len(raw) == 2:
        return struct.unpack("<f", b"\x00\x00" + raw)[0]
    if dtype in _SCALARS and len(raw) == _SCALARS[dtype][1]:
        return struct.unpack(_SCALARS[dtype][0], raw)[0]
    return None


def header_tensors(path: str | Path, prefix: str = "", label: str | None = None) -> dict[str, HeaderTensor]:
    """Key (prefix stripped) -> shape of every tensor of a safetensors file, read from its header (a
    one-element tensor's value too); refuses a file that is no safetensors in one line."""
    label = label or str(path)
    size, header = read_raw_header(path, label, LoraError)
    header.pop("__metadata__", None)
    try:
        with open(path, "rb") as f:
            out = {}
            for key, info in header.items():
                shape = tuple(int(x) for x in info["shape"])
                value = _scalar(f, info, 8 + size) if math.prod(shape) == 1 else None
                out[key.removeprefix(prefix)] = HeaderTensor(shape, value)
            return out
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise LoraError(f"{label}: not a readable safetensors file ({exc})") from exc


def check_lora_files(components: dict[str, tuple[list[Path], str]], loras: Sequence[tuple[Path, float, str]],
                     rename: Rename) -> int:
    """The set checked against a pack from headers alone: `components` maps the DiT (and the connector)
    to its files and key prefix, `loras` are (file, strength, the label its errors name). Returns how
    many weights the set updates; raises the first refusal (`LoraError`, one line)."""
    inputs = [LoraInput(header_tensors(path, label=label), float(strength), label) for path, strength, label in loras]
    updated = 0
    for component, (files, prefix) in components.items():
        weights: dict = {}
        for file in files:
            weights.update(header_tensors(file, prefix))
        updated += len(check_loras(weights, inputs, rename, file=str(files[0].name), component=component))
    return updated
