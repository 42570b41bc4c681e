"""LoRA files in the key layouts people's LoRAs come in, read into one form: reference module name ->
(A, B, scale, the file's key).

Layouts (the facts from upstream's loader and trainer, the MLX port's renaming map, diffusers'
`convert_ltx2_to_diffusers.py`, ComfyUI's LoRA saver and kohya's naming):

| layout      | a key looks like                                              | factors                          |
|-------------|---------------------------------------------------------------|----------------------------------|
| reference   | `diffusion_model.transformer_blocks.0.attn1.to_q.lora_A.weight` | `lora_A` (r, in), `lora_B` (out, r) |
| comfyui     | `diffusion_model.transformer_blocks.0.attn1.to_q.lora_down.weight` | `lora_down`, `lora_up`, `.alpha` |
| kohya       | `lora_unet_transformer_blocks_0_attn1_to_q.lora_down.weight`  | as comfyui, dots written `_`     |
| diffusers   | `transformer.transformer_blocks.0.attn1.to_q.lora_A.weight`   | as reference, diffusers' names   |

The reference layout is what upstream's trainer writes ("ComfyUI-compatible", `diffusion_model.`
prefix) and what `LTXV_LORA_COMFY_RENAMING_MAP` strips. An `.alpha` beside a module's factors scales its update by alpha / rank, in any layout, as ComfyUI
reads it (kohya's convention); without one the scale is 1, as upstream's `apply_loras` (which knows no
alpha: the reference layout carries none).
Module names are the reference checkpoint's (`to_out.0`, `ff.net.0.proj`, `linear_1`); the pack's own
renames are the transformer's `sanitize`. Kohya names are resolved against the names a pack has, since
`_` is ambiguous (`transformer_blocks_0_to_out_0`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ltx_engine.rules.errors import PackError


class Shaped(Protocol):
    """A LoRA tensor, or only its header entry: the shape is what key resolution reads."""

    @property
    def shape(self) -> tuple[int, ...]: ...


class LoraError(PackError):
    """A LoRA the farm refuses, in one line naming the file and the first bad key (a ValueError)."""


class LoraKeyError(LoraError):
    """A key that is no LoRA factor, or that matches no module of the pack."""


class LoraShapeError(LoraError):
    """Factors whose rank or shapes do not fit their target."""


class LoraModelError(LoraShapeError):
    """Factors for a model of another width (an LTX-2.3 LoRA on a 2.5 pack, or the reverse)."""


@dataclass(frozen=True)
class Layout:
    """How one layout writes a factor key: prefix, the down / up suffixes, and its alpha suffix."""

    name: str
    prefix: str
    down: str
    up: str
    alpha: str | None = None
    dots_as_underscores: bool = False


ALPHA = ".alpha"
LAYOUTS = (
    Layout("reference", "diffusion_model.", ".lora_A.weight", ".lora_B.weight"),
    Layout("comfyui", "diffusion_model.", ".lora_down.weight", ".lora_up.weight", ".alpha"),
    Layout("kohya", "lora_unet_", ".lora_down.weight", ".lora_up.weight", ".alpha", dots_as_underscores=True),
    Layout("diffusers", "transformer.", ".lora_A.weight", ".lora_B.weight"),
)

# diffusers' module names -> the reference's (the inverse of diffusers' convert_ltx2_to_diffusers
# rename dicts), applied to a module name's start; connector blocks are renamed inside the connector.
DIFFUSERS_TO_REFERENCE = (
    ("proj_in.", "patchify_proj."),
    ("audio_proj_in.", "audio_patchify_proj."),
    ("time_embed.", "adaln_single."),
    ("audio_time_embed.", "audio_adaln_single."),
    ("av_cross_attn_video_scale_shift.", "av_ca_video_scale_shift_adaln_single."),
    ("av_cross_attn_video_a2v_gate.", "av_ca_a2v_gate_adaln_single."),
    ("av_cross_attn_audio_scale_shift.", "av_ca_audio_scale_shift_adaln_single."),
    ("av_cross_attn_audio_v2a_gate.", "av_ca_v2a_gate_adaln_single."),
    ("connectors.video_connector.", "video_embeddings_connector."),
    ("connectors.audio_connector.", "audio_embeddings_connector."),
    ("connectors.text_proj_in.", "text_embedding_projection.aggregate_embed."),
)
DIFFUSERS_CONNECTOR_BLOCKS = (".transformer_blocks.", ".transformer_1d_blocks.")

# Reference modules that live in the pack's connector component, not the DiT: a LoRA factor for them
# is fused into the connector (ComfyUI's LTX-AV model holds the connectors inside its diffusion model).
CONNECTOR_PREFIXES = ("video_embeddings_connector.", "audio_embeddings_connector.", "text_embedding_projection.")


@dataclass(frozen=True)
class Factor:
    """One LoRA update of one module: delta = scale * B @ A (strength applied by the caller)."""

    a: Shaped
    b: Shaped
    scale: float
    key: str


def component_of(module: str) -> str:
    """The pack component a reference module name belongs to."""
    return "connector" if module.startswith(CONNECTOR_PREFIXES) else "transformer"


def _layout(key: str) -> Layout | None:
    for layout in LAYOUTS:
        if key.startswith(layout.prefix) and key.endswith((layout.down, layout.up, ALPHA)):
            return layout
    return None


def _diffusers_to_reference(module: str) -> str:
    for old, new in DIFFUSERS_TO_REFERENCE:
        if module.startswith(old):
            module = new + module.removeprefix(old)
            break
    if module.startswith(CONNECTOR_PREFIXES[:2]):
        module = module.replace(*DIFFUSERS_CONNECTOR_BLOCKS)
    return module


def _module(key: str, layout: Layout, kohya: dict[str, str], file: str) -> str:
    """The reference module name a factor key updates."""
    body = key.removeprefix(layout.prefix)
    for suffix in (layout.down, layout.up, layout.alpha):
        if suffix and body.endswith(suffix):
            body = body.removesuffix(suffix)
            break
    if layout.name == "diffusers":
        return _diffusers_to_reference(body)
    if layout.dots_as_underscores:
        if body in kohya:
            return kohya[body]
        for prefix in CONNECTOR_PREFIXES:  # another component's module: resolved when that one fuses
            if body.startswith(prefix.replace(".", "_")):
                return prefix + body.removeprefix(prefix.replace(".", "_"))
        raise LoraKeyError(f"{file}: key {key!r} matches no module of the pack")
    return body


def _scale(tensors: dict, layout: Layout, down_key: str, rank: int, file: str) -> float:
    """alpha / rank where the file has the module's `.alpha` (ComfyUI reads it in every layout), else 1."""
    alpha_key = down_key.removesuffix(layout.down) + ALPHA
    if alpha_key not in tensors:
        return 1.0
    alpha = tensors[alpha_key]
    value = float(alpha.item()) if hasattr(alpha, "item") else float(alpha)
    if rank <= 0:
        raise LoraShapeError(f"{file}: key {down_key!r} has rank {rank}")
    return value / rank


def read_factors(tensors: dict, *, file: str, modules: tuple[str, ...] = ()) -> dict[str, Factor]:
    """Reference module name -> its factors, from a LoRA in any known layout. `modules` (reference
    names the pack has) resolve kohya's underscored names. A key of no layout, a down factor without
    its up (or the reverse), or one module given twice, is refused naming the key."""
    kohya = {m.replace(".", "_"): m for m in modules}
    out: dict[str, Factor] = {}
    for key in sorted(tensors):
        layout = _layout(key)
        if layout is None:
            raise LoraKeyError(f"{file}: key {key!r} is not a LoRA factor (lora_A/lora_B, lora_down/lora_up, alpha)")
        if key.endswith(ALPHA):
            if not any(key.removesuffix(ALPHA) + x.down in tensors for x in LAYOUTS):
                raise LoraKeyError(f"{file}: key {key!r} has no matching down factor (lora_A / lora_down)")
            continue
        if key.endswith(layout.up):
            if key.removesuffix(layout.up) + layout.down not in tensors:
                raise LoraKeyError(f"{file}: key {key!r} has no matching {layout.down.lstrip('.')}")
            continue
        up_key = key.removesuffix(layout.down) + layout.up
        if up_key not in tensors:
            raise LoraKeyError(f"{file}: key {key!r} has no matching {up_key!r}")
        module = _module(key, layout, kohya, file)
        if module in out:
            raise LoraKeyError(f"{file}: key {key!r} updates {module!r}, which {out[module].key!r} updates too")
        a, b = tensors[key], tensors[up_key]
        out[module] = Factor(a, b, _scale(tensors, layout, key, int(a.shape[0]), file), key)
    return out
