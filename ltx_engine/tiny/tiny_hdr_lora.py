"""The tiny SDR-to-HDR IC-LoRA the tiny 2.5 pack carries (`farm pack tiny --variant 2.5`), from its own seed:
the reference layout (`diffusion_model.<module>.lora_A/B.weight`, bf16) and upstream's HDR metadata
(`hdr_transform` acescct, `reference_downscale_factor` 1), which `hdr_lora.read_hdr_lora_config` reads."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np

from ltx_engine.rules.hdr import ACESCCT
from ltx_engine.rules.hdr_lora import HDR_LORA_FILE  # noqa: F401 - the file name the tiny pack writes it under

HDR_LORA_SEED_OFFSET = 2929  # the tiny HDR LoRA's own draw, apart from every other tiny file's


def write_hdr_lora(path: Path, tcfg: dict, seed: int, rank: int = 4) -> None:
    """A tiny SDR-to-HDR IC-LoRA in the reference layout (`diffusion_model.<module>.lora_A/B.weight`, bf16)
    on every block's video self- and cross-attention query/output, with upstream's HDR metadata."""
    rng = np.random.default_rng(seed + HDR_LORA_SEED_OFFSET)
    dim = tcfg["num_attention_heads"] * tcfg["attention_head_dim"]
    tensors = {}
    for block in range(tcfg["num_layers"]):
        for module in ("attn1.to_q", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_out.0"):
            key = f"diffusion_model.transformer_blocks.{block}.{module}"
            tensors[f"{key}.lora_A.weight"] = mx.array(
                (rng.standard_normal((rank, dim)) / np.sqrt(dim)).astype(np.float32)
            )
            tensors[f"{key}.lora_B.weight"] = mx.array(
                (0.5 * rng.standard_normal((dim, rank))).astype(np.float32)
            )
    tensors = {k: v.astype(mx.bfloat16) for k, v in tensors.items()}
    mx.eval(tensors)
    metadata = {"hdr_transform": ACESCCT, "reference_downscale_factor": "1"}
    mx.save_safetensors(str(path), tensors, metadata=metadata)
