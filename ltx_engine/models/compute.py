"""Attention and feed-forward modules computed in a narrower float dtype (`--compute-dtype float16`).

Nothing is cast in place: a warm model serves float32 and float16 renders alike, and the overflow guard's
recompute is the plain float32 path. Per call the activations are cast, and the layer's float parameters
(weights of a float Linear, scales / biases of a quantized one, biases, norm weights, LoRA factors) are
cast as they are read; a quantized weight stays packed. RoPE runs on the tables' dtype and the rotated
q / k are cast back. The module's output returns in its input's dtype, so the residual stream and the
AdaLN modulation keep theirs.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


def _cast(x: mx.array | None, dtype: mx.Dtype) -> mx.array | None:
    return None if x is None else x.astype(dtype)


def linear(layer: nn.Module, x: mx.array, dtype: mx.Dtype | None) -> mx.array:
    """`layer(x)`, or the same Linear / QuantizedLinear / LoRA adapter computed in `dtype`."""
    if dtype is None:
        return layer(x)
    x = x.astype(dtype)
    if "lora_a" in layer and "base" in layer:
        y = linear(layer.base, x, dtype)
        return y + (x @ layer.lora_a.astype(dtype).T) @ layer.lora_b.astype(dtype).T
    bias = _cast(layer.get("bias"), dtype)
    if isinstance(layer, nn.QuantizedLinear):
        y = mx.quantized_matmul(x, layer.weight, scales=layer.scales.astype(dtype),
                                biases=_cast(layer.get("biases"), dtype), transpose=True,
                                group_size=layer.group_size, bits=layer.bits, mode=getattr(layer, "mode", "affine"))
        return y if bias is None else y + bias
    y = x @ layer.weight.astype(dtype).T
    return y if bias is None else y + bias


def rms_norm(norm: nn.RMSNorm, x: mx.array, dtype: mx.Dtype | None) -> mx.array:
    if dtype is None:
        return norm(x)
    return mx.fast.rms_norm(x.astype(dtype), norm.weight.astype(dtype), norm.eps)


def dtype_of(name: str | None) -> mx.Dtype | None:
    """A compute dtype's name -> the MLX dtype, None for the default float32 path."""
    if name in (None, "float32"):
        return None
    return {"float16": mx.float16, "bfloat16": mx.bfloat16}[name]
