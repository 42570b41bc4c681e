"""Unfused vs fused on the tiny q8 DiT: the forward of the set attached as adapters equals the dense
float32 model `dequantize(W) + sum s B A` (what the set means on the weights the pack holds); fusing
and requantizing to q8 loses part of the update. Everything in float32 so that only that loss shows.
Two seeded LoRAs (one in ComfyUI's layout with an alpha) on video, audio and audio-video modules."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine.denoise import StageInputs, build_stage_states, model_forward
from ltx_engine.loading.loader import apply_weights
from ltx_engine.loading.model_classes import model_class
from ltx_engine.lora.lora import LoraInput, check_loras, fuse_loras, lora_deltas, quantization_of
from ltx_engine.lora.lora_adapters import LoraAdapter, attach_loras, detach_loras
from ltx_engine.tiny.tiny_loras import TINY_LORA_MODULES, in_layout, tiny_lora_factors

pytestmark = pytest.mark.timeout(20)


def _dense(q: dict[str, mx.array], loras: list[LoraInput], rename) -> dict[str, mx.array]:
    out = dict(q)
    for target, delta in lora_deltas(check_loras(q, loras, rename, file="dit")).items():
        base = target.removesuffix(".weight")
        if f"{base}.scales" in q:
            bits, group = quantization_of(q[target], q[f"{base}.scales"], delta.shape[-1])
            w = mx.dequantize(q[target], q[f"{base}.scales"], q[f"{base}.biases"], group_size=group, bits=bits)
            out[target] = w + delta
            del out[f"{base}.scales"], out[f"{base}.biases"]
        else:
            out[target] = q[target] + delta
    return out


def test_unfused_set_on_the_tiny_q8_dit_is_the_dense_update(tmp_path):
    from ltx_engine.loading.pack import Pack
    from ltx_engine.tiny.tiny_pack import write_tiny_pack

    write_tiny_pack(tmp_path / "q8", seed=0, bits=8)
    pack = Pack(tmp_path / "q8")
    cls, cfg = model_class("transformer"), pack.component_config("transformer")
    q = {k: v if v.dtype == mx.uint32 else v.astype(mx.float32) for k, v in pack.tensors("transformer").items()}
    shapes = {}
    for m in TINY_LORA_MODULES:
        key = next(iter(cls.sanitize({f"{m}.weight": 0})))
        scales = q.get(key.removesuffix(".weight") + ".scales")
        shapes[m] = (q[key].shape[0], scales.shape[-1] * 32) if scales is not None else tuple(q[key].shape)
    loras = [LoraInput(in_layout(tiny_lora_factors(shapes, 1), "reference"), 0.8, "style"),
             LoraInput(in_layout(tiny_lora_factors(shapes, 2), "comfyui", 2.0), 0.5, "camera")]

    def build(tensors):
        return apply_weights(cls.from_config(cfg), tensors, file="dit")

    dense, fused, plain, unfused = build(_dense(q, loras, cls.sanitize)), build(fuse_loras(q, loras, cls.sanitize,
                                                                                          file="dit")), build(q), build(q)
    assert len(attach_loras(unfused, q, loras, cls.sanitize, file="dit")) == len(TINY_LORA_MODULES)
    inputs = StageInputs(frames=17, height=64, width=96, fps=24.0, seed=3, sigmas=[0.9, 0.0], contexts={}, audio_frames=5)
    video, audio = build_stage_states(inputs, 128)
    rng, t = np.random.default_rng(0), cfg["transformer"]
    ctx = {"video_context": rng.standard_normal((1, 6, t["cross_attention_dim"])).astype(np.float32),
           "audio_context": rng.standard_normal((1, 6, t["audio_cross_attention_dim"])).astype(np.float32)}
    want = model_forward(dense, video, audio, 0.9, ctx)

    def rel(model) -> tuple[float, float]:
        got = model_forward(model, video, audio, 0.9, ctx)
        return tuple(float(np.linalg.norm(g - w) / np.linalg.norm(w)) for g, w in zip(got, want, strict=True))

    r_unfused, r_fused, r_plain = rel(unfused), rel(fused), rel(plain)
    print("tiny q8 DiT rel to dense (video, audio): unfused", r_unfused, "fused q8", r_fused, "no LoRA", r_plain)
    assert max(r_unfused) <= 1e-5
    assert min(r_fused) > 100 * max(r_unfused)  # the requantization loss the unfused mode avoids
    assert detach_loras(unfused) == len(TINY_LORA_MODULES)
    assert not any(isinstance(m, LoraAdapter) for _, m in unfused.named_modules())
    assert np.array_equal(model_forward(unfused, video, audio, 0.9, ctx)[0], model_forward(plain, video, audio, 0.9, ctx)[0])
