"""A set of two LoRAs at different strengths against ltx-core 1.0.0's `apply_loras`, float32, <= 1e-4.

- bf16 weights: `fuse_loras` == `apply_loras(..., dtype=float32)` on the same two LoRAs (the second
  given to us in ComfyUI's layout with an alpha, to the reference in its own; one target is renamed in
  the pack, `ff.net.0.proj` -> `ff.proj_in`, one is an audio module).
- q8 / q4 weights (1.0.0 has no MLX quantization): ours == dequantize -> add the reference's summed
  float32 deltas (`_prepare_deltas`) -> quantize ONCE; and requantizing after each LoRA (twice) is
  shown to give another weight.
- the unfused adapter (`lora_adapters`) on a float and a q8 layer == the dense update
  `x @ (W + sum s B A)^T + bias`, W the weight the layer really holds; 1.0.0 has no adapter, so the
  dense side is the reference's own summed delta.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

from ltx_core.loader.fuse_loras import _prepare_deltas, apply_loras  # noqa: E402
from ltx_core.loader.primitives import LoraStateDictWithStrength, StateDict  # noqa: E402

from ltx_engine.loading.model_classes import model_class  # noqa: E402
from ltx_engine.lora.lora import LoraInput, fuse_loras  # noqa: E402
from ltx_engine.lora.lora_adapters import LoraAdapter, attach_loras, detach_loras  # noqa: E402
from ltx_engine.tiny.tiny_loras import in_layout, tiny_lora_factors  # noqa: E402

pytestmark = pytest.mark.timeout(20)
GROUP, S1, S2, ALPHA = 32, 0.8, -0.35, 2.0
SHAPES = {"transformer_blocks.0.attn1.to_q": (96, 128), "transformer_blocks.0.ff.net.0.proj": (64, 128),
          "transformer_blocks.0.audio_attn1.to_k": (32, 64)}
SANITIZE = model_class("transformer").sanitize


def _pack_key(module: str) -> str:
    return next(iter(SANITIZE({f"{module}.weight": 0})))


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    w = {m: (rng.standard_normal(s) / np.sqrt(s[1])).astype(np.float32) for m, s in SHAPES.items()}
    return {m: torch.from_numpy(x).to(torch.bfloat16).float().numpy() for m, x in w.items()}  # bf16 values


def _loras():
    one = tiny_lora_factors(SHAPES, seed=1)
    two = tiny_lora_factors({m: SHAPES[m] for m in list(SHAPES)[:2]}, seed=2, rank=6)  # shares to_q, ff with one
    return one, two


def _ref_sd(factors) -> StateDict:
    sd = {}
    for m, (a, b) in factors.items():
        sd[f"{m}.lora_A.weight"], sd[f"{m}.lora_B.weight"] = torch.from_numpy(a), torch.from_numpy(b)
    return StateDict(sd, torch.device("cpu"), 0, {torch.float32})


def _ref_set():
    one, two = _loras()
    return [LoraStateDictWithStrength(_ref_sd(one), S1), LoraStateDictWithStrength(_ref_sd(two), S2)]


def _ours_set():
    one, two = _loras()
    return [LoraInput(in_layout(one, "reference"), S1, "one"), LoraInput(in_layout(two, "comfyui", ALPHA), S2, "two")]


def _rel(x, y) -> float:
    return float(np.linalg.norm(np.asarray(x) - np.asarray(y)) / np.linalg.norm(np.asarray(y)))


def test_two_loras_on_bf16_weights_match_apply_loras():
    w = _weights()
    model = StateDict({f"{m}.weight": torch.from_numpy(x).to(torch.bfloat16) for m, x in w.items()},
                      torch.device("cpu"), 0, {torch.bfloat16})
    ref = apply_loras(model, _ref_set(), dtype=torch.float32).sd
    ours = fuse_loras({_pack_key(m): mx.array(x) for m, x in w.items()}, _ours_set(), SANITIZE, file="dit")
    for m in SHAPES:
        rel = _rel(ours[_pack_key(m)], ref[f"{m}.weight"].numpy())
        print("lora stack bf16", m, "rel", rel)
        assert rel <= 1e-4
    as_bf16 = fuse_loras({_pack_key(m): mx.array(x).astype(mx.bfloat16) for m, x in w.items()}, _ours_set(),
                         SANITIZE, file="dit")
    assert all(v.dtype == mx.bfloat16 for v in as_bf16.values())


def _requant(x: np.ndarray, bits: int) -> np.ndarray:
    q = mx.quantize(mx.array(x), group_size=GROUP, bits=bits)
    return np.array(mx.dequantize(*q, group_size=GROUP, bits=bits))


@pytest.mark.parametrize("bits", [8, 4])
def test_two_loras_on_quantized_weights_requantize_once(bits):
    w, weights, base = _weights(), {}, {}
    for m, x in w.items():
        packed, scales, biases = mx.quantize(mx.array(x), group_size=GROUP, bits=bits)
        k = _pack_key(m).removesuffix(".weight")
        weights |= {f"{k}.weight": packed, f"{k}.scales": scales, f"{k}.biases": biases}
        base[m] = np.array(mx.dequantize(packed, scales, biases, group_size=GROUP, bits=bits))
    ours = fuse_loras(weights, _ours_set(), SANITIZE, file="dit")
    refs = _ref_set()
    for m in SHAPES:
        k = _pack_key(m).removesuffix(".weight")
        got = np.array(mx.dequantize(ours[f"{k}.weight"], ours[f"{k}.scales"], ours[f"{k}.biases"],
                                     group_size=GROUP, bits=bits))
        summed = _prepare_deltas(refs, f"{m}.weight", torch.float32, torch.device("cpu")).numpy()
        once = _requant(base[m] + summed, bits)
        per_lora = [_prepare_deltas([r], f"{m}.weight", torch.float32, torch.device("cpu")) for r in refs]
        twice = base[m]
        for d in per_lora:
            twice = twice if d is None else _requant(twice + d.numpy(), bits)
        rel, rel_twice = _rel(got, once), _rel(twice, once)
        print(f"lora stack q{bits}", m, "rel vs once", rel, "twice vs once", rel_twice)
        assert rel <= 1e-4
        if all(d is not None for d in per_lora):  # both LoRAs hit it: requantizing per LoRA is another weight
            assert rel_twice > 10 * max(rel, 1e-6)


@pytest.mark.parametrize("bits", [None, 8])
def test_unfused_adapter_matches_the_dense_update(bits):
    m = "transformer_blocks.0.attn1.to_q"
    rng = np.random.default_rng(9)
    layer = nn.Linear(SHAPES[m][1], SHAPES[m][0])
    layer.weight = mx.array(_weights()[m])
    if bits:
        layer = nn.QuantizedLinear.from_linear(layer, group_size=GROUP, bits=bits)
        held = np.array(mx.dequantize(layer.weight, layer.scales, layer.biases, group_size=GROUP, bits=bits))
    else:
        held = np.array(layer.weight)
    model = nn.Module()
    model.transformer_blocks = [nn.Module()]
    model.transformer_blocks[0].attn1 = nn.Module()
    model.transformer_blocks[0].attn1.to_q = layer
    weights = {k: v for k, v in (("transformer_blocks.0.attn1.to_q." + n, p) for n, p in layer.parameters().items())}
    only_q = [LoraInput({k: v for k, v in x.tensors.items() if ".attn1.to_q." in k}, x.strength, x.file)
              for x in _ours_set()]
    paths = attach_loras(model, weights, only_q, SANITIZE, file="dit")
    assert paths == ["transformer_blocks.0.attn1.to_q"]
    assert isinstance(model.transformer_blocks[0].attn1.to_q, LoraAdapter)
    x = rng.standard_normal((3, 5, SHAPES[m][1])).astype(np.float32)
    got = np.array(model.transformer_blocks[0].attn1.to_q(mx.array(x)))
    delta = _prepare_deltas(_ref_set(), f"{m}.weight", torch.float32, torch.device("cpu")).numpy()
    dense = x @ (held + delta).T + np.array(layer.bias)
    rel = _rel(got, dense)
    print("unfused adapter", "q8" if bits else "float", "rel vs dense", rel)
    assert rel <= 1e-4
    assert detach_loras(model) == 1 and model.transformer_blocks[0].attn1.to_q is layer
