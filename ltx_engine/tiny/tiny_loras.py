"""Seeded tiny user LoRAs for tests: the same factors written in any layout `ltx_engine.rules.lora_keys` reads.

`tiny_lora_factors` draws (A, B) for reference module names at the shapes a pack gives them;
`in_layout` writes them with a layout's prefix, suffixes, alpha and names (diffusers' renames and
kohya's underscores), so a test can hold every layout to the reference one.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np

from ltx_engine.rules.lora_keys import DIFFUSERS_CONNECTOR_BLOCKS, DIFFUSERS_TO_REFERENCE, LAYOUTS

# Video and audio attention of both blocks, a feed-forward (renamed in the pack), an audio-video
# cross-attention and the video connector's first attention: what user LoRAs touch.
TINY_LORA_MODULES = (
    "transformer_blocks.0.attn1.to_q", "transformer_blocks.0.attn1.to_out.0", "transformer_blocks.1.attn2.to_v",
    "transformer_blocks.0.ff.net.0.proj", "transformer_blocks.1.audio_attn1.to_k",
    "transformer_blocks.0.audio_to_video_attn.to_q", "transformer_blocks.1.audio_ff.net.2",
)
TINY_CONNECTOR_MODULE = "video_embeddings_connector.transformer_1d_blocks.0.attn1.to_q"


def tiny_lora_factors(shapes: dict[str, tuple[int, int]], seed: int, rank: int = 4,
                      scale: float = 0.05) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Reference module -> (A (rank, in), B (out, rank)) float32, drawn from one seeded generator."""
    rng = np.random.default_rng(seed)
    out = {}
    for module in sorted(shapes):
        o, i = shapes[module]
        a = (rng.standard_normal((rank, i)) / np.sqrt(i)).astype(np.float32)
        b = (scale * rng.standard_normal((o, rank))).astype(np.float32)
        out[module] = (a, b)
    return out


def _diffusers_name(module: str) -> str:
    if module.startswith(("video_embeddings_connector.", "audio_embeddings_connector.")):
        module = module.replace(DIFFUSERS_CONNECTOR_BLOCKS[1], DIFFUSERS_CONNECTOR_BLOCKS[0])
    for diffusers, reference in DIFFUSERS_TO_REFERENCE:
        if module.startswith(reference):
            return diffusers + module.removeprefix(reference)
    return module


def in_layout(factors: dict[str, tuple[np.ndarray, np.ndarray]], layout: str,
              alpha: float | None = None) -> dict[str, mx.array]:
    """The factors as a LoRA file of `layout` holds them; with `alpha`, B is divided by alpha / rank
    so that the file's update (alpha / rank * B @ A) is the same."""
    spec = next(x for x in LAYOUTS if x.name == layout)
    tensors = {}
    for module, (a, b) in factors.items():
        name = _diffusers_name(module) if layout == "diffusers" else module
        name = name.replace(".", "_") if spec.dots_as_underscores else name
        key = spec.prefix + name
        up = b
        if alpha is not None and spec.alpha:
            up = (b / np.float32(alpha / a.shape[0])).astype(np.float32)
            tensors[key + spec.alpha] = mx.array(np.float32(alpha))
        tensors[key + spec.down] = mx.array(a)
        tensors[key + spec.up] = mx.array(up)
    return tensors


def write_tiny_lora(path: str | Path, factors: dict[str, tuple[np.ndarray, np.ndarray]], layout: str = "reference",
                    alpha: float | None = None) -> Path:
    """Save the factors as a `.safetensors` LoRA in `layout`."""
    path = Path(path)
    tensors = in_layout(factors, layout, alpha)
    mx.eval(tensors)
    mx.save_safetensors(str(path), tensors)
    return path
