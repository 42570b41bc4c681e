"""Seeded user LoRAs for the tiny pack (farm tests): one in the reference layout, one in
ComfyUI's (lora_down / lora_up with an alpha), on video, audio and audio-video modules of the DiT."""

from __future__ import annotations

from pathlib import Path

STYLE_SEED, CAMERA_SEED = 11, 12


def tiny_lora_shapes(pack_dir: Path) -> dict[str, tuple[int, int]]:
    """Reference module -> (out, in) of the tiny pack's DiT (a quantized weight read at its true inputs)."""
    from ltx_engine.loading.model_classes import model_class
    from ltx_engine.loading.pack import Pack
    from ltx_engine.rules.lora_keys import LAYOUTS  # noqa: F401 - the layouts the files are written in
    from ltx_engine.tiny.tiny_loras import TINY_LORA_MODULES

    pack = Pack(Path(pack_dir))
    weights, sanitize = pack.tensors("transformer"), model_class("transformer").sanitize
    shapes = {}
    for module in TINY_LORA_MODULES:
        key = next(iter(sanitize({f"{module}.weight": 0})))
        scales = weights.get(key.removesuffix(".weight") + ".scales")
        w = weights[key]
        shapes[module] = (int(w.shape[0]), int(scales.shape[-1] * 32) if scales is not None else int(w.shape[1]))
    return shapes


def write_user_loras(folder: Path, pack_dir: Path, scale: float = 0.05) -> tuple[Path, Path]:
    """`style.safetensors` (reference layout) and `camera.safetensors` (ComfyUI, alpha 2) in `folder`."""
    from ltx_engine.tiny.tiny_loras import tiny_lora_factors, write_tiny_lora

    folder.mkdir(parents=True, exist_ok=True)
    shapes = tiny_lora_shapes(pack_dir)
    style = write_tiny_lora(folder / "style.safetensors", tiny_lora_factors(shapes, STYLE_SEED, scale=scale))
    camera = write_tiny_lora(folder / "camera.safetensors", tiny_lora_factors(shapes, CAMERA_SEED, scale=scale),
                             layout="comfyui", alpha=2.0)
    return style, camera
