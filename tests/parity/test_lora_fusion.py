"""LoRA fusion on bf16 / float, q8 and q4 weights against ltx-core 1.0.0's `apply_loras`.

The reference fuses `W + strength * B @ A` on float weights (and dequantize -> add -> requantize on
fp8 ones); MLX packs quantize Linear weights affinely per group, so ours dequantizes at the pack's own
bits and group size, adds in float32 and requantizes with MLX's quantizer. The float path must equal
the reference; a quantized path must be the reference's float result quantized at the same bits and
group (what a pack converted from the fused weights would hold), within one quantization step.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

from ltx_core.loader.fuse_loras import _prepare_deltas, apply_loras  # noqa: E402
from ltx_core.loader.primitives import LoraStateDictWithStrength, StateDict  # noqa: E402

from ltx_engine.loading.model_classes import model_class  # noqa: E402
from ltx_engine.lora.lora import fuse_lora  # noqa: E402

OUT, IN, RANK, GROUP, STRENGTH = 96, 128, 8, 32, 0.5
TARGET = "transformer_blocks.0.attn1.to_q"


def _arrays():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((OUT, IN)).astype(np.float32) / np.sqrt(IN)
    a = rng.standard_normal((RANK, IN)).astype(np.float32) * 0.1
    b = rng.standard_normal((OUT, RANK)).astype(np.float32) * 0.1
    return w, a, b


def _lora_sd(a: np.ndarray, b: np.ndarray) -> StateDict:
    return StateDict({f"{TARGET}.lora_A.weight": torch.from_numpy(a), f"{TARGET}.lora_B.weight": torch.from_numpy(b)},
                     torch.device("cpu"), a.nbytes + b.nbytes, {torch.float32})


def _reference(w_bf16: torch.Tensor, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """apply_loras on a bf16 weight (the only float dtype 1.0.0 fuses), result kept in float32."""
    model = StateDict({f"{TARGET}.weight": w_bf16}, torch.device("cpu"), w_bf16.nbytes, {torch.bfloat16})
    fused = apply_loras(model, [LoraStateDictWithStrength(_lora_sd(a, b), STRENGTH)], dtype=torch.float32)
    return fused.sd[f"{TARGET}.weight"].numpy()


def _reference_delta(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The reference's delta, (B * strength) @ A in float32 (`_prepare_deltas`), for weights it cannot hold."""
    lora = [LoraStateDictWithStrength(_lora_sd(a, b), STRENGTH)]
    return _prepare_deltas(lora, f"{TARGET}.weight", torch.float32, torch.device("cpu")).numpy()


def _ours(weights: dict[str, mx.array], a: np.ndarray, b: np.ndarray) -> dict[str, mx.array]:
    lora = {f"diffusion_model.{TARGET}.lora_A.weight": mx.array(a), f"diffusion_model.{TARGET}.lora_B.weight": mx.array(b)}
    return fuse_lora(weights, lora, STRENGTH, model_class("transformer").sanitize, file="dit", lora_file="lora")


def _rel(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def test_float_fusion_matches_reference():
    w, a, b = _arrays()
    w_bf16 = torch.from_numpy(w).to(torch.bfloat16)
    got = np.array(_ours({f"{TARGET}.weight": mx.array(w_bf16.float().numpy())}, a, b)[f"{TARGET}.weight"])
    rel = _rel(got, _reference(w_bf16, a, b))
    print("lora fusion float32 rel", rel)
    assert rel <= 1e-4


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_fusion_is_the_reference_requantized(bits):
    w, a, b = _arrays()
    packed, scales, biases = mx.quantize(mx.array(w), group_size=GROUP, bits=bits)
    base = mx.dequantize(packed, scales, biases, group_size=GROUP, bits=bits)
    weights = {f"{TARGET}.weight": packed, f"{TARGET}.scales": scales, f"{TARGET}.biases": biases}
    out = _ours(weights, a, b)
    assert out[f"{TARGET}.weight"].dtype == packed.dtype and out[f"{TARGET}.weight"].shape == packed.shape
    assert out[f"{TARGET}.scales"].shape == scales.shape
    got = np.array(mx.dequantize(out[f"{TARGET}.weight"], out[f"{TARGET}.scales"], out[f"{TARGET}.biases"],
                                 group_size=GROUP, bits=bits))
    ref = np.array(base) + _reference_delta(a, b)  # the reference's fusion of the weights the pack really holds
    requant = np.array(mx.dequantize(*mx.quantize(mx.array(ref), group_size=GROUP, bits=bits), group_size=GROUP, bits=bits))
    rel = _rel(got, requant)
    step = np.repeat(np.abs(np.array(out[f"{TARGET}.scales"])), GROUP, axis=1)
    print(f"lora fusion q{bits} rel vs reference requantized", rel, "max err / step", np.max(np.abs(got - ref) / step))
    assert rel <= 1e-4
    assert np.all(np.abs(got - ref) <= step + 1e-6)  # within one step of MLX's affine grid of the float fusion


def test_a_bf16_weight_is_fused_by_upstreams_mac_rule_float32_not_the_cpu_rule_bf16():
    """ltx-core 1.2.0 aggregates LoRA products in float32 on MPS and in bf16 on CPU/CUDA
    (tests/parity/upstream_rules.py `fuse_lora_1_2_0`); the farm keeps the Mac's rule on every backend.
    Its bf16 result is the MPS rule's up to float32 rounding of the product's association (at most one
    bf16 step, on a few weights); the CPU rule is further off, on many more weights."""
    from tests.parity.upstream_rules import fuse_lora_1_2_0

    w, a, b = _arrays()
    w_bf16 = torch.from_numpy(w).to(torch.bfloat16)
    got = np.array(_ours({f"{TARGET}.weight": mx.array(w_bf16.float().numpy()).astype(mx.bfloat16)}, a, b)
                   [f"{TARGET}.weight"].astype(mx.float32))
    lora = [(torch.from_numpy(a), torch.from_numpy(b), STRENGTH)]
    mac = fuse_lora_1_2_0(w_bf16, lora, "mps").float().numpy()
    cpu = fuse_lora_1_2_0(w_bf16, lora, "cpu").float().numpy()
    ulp = np.abs(w_bf16.float().numpy()) * 2.0 ** -7 + 1e-30  # one bf16 step at the weight's magnitude (upper bound)
    off_mac, off_cpu = float(np.mean(got != mac)), float(np.mean(got != cpu))
    print(f"bf16 fusion: weights off the MPS rule {off_mac:.2%}, off the CPU rule {off_cpu:.2%}")
    assert np.all(np.abs(got - mac) <= 2 * ulp)
    assert off_mac <= 0.01 and off_cpu >= 5 * max(off_mac, 1e-3)
