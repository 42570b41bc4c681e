"""q8/q4 packs of the tiny DiT: every Linear inside transformer_blocks quantized, loaded back strictly."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from ltx_engine.loading.loader import apply_weights, quantize_weights
from ltx_engine.models import patchify as P
from ltx_engine.models.transformer import LTXModel, Modality, TransformerConfig, quantizable, tiny_config
from tests.unit.sp_model import seeded_model

GROUP = 32

def _inputs(cfg: dict) -> tuple[Modality, Modality]:
    rng = np.random.default_rng(1)
    f, h, w = 2, 4, 6
    tv = f * h * w
    video = Modality(
        latent=mx.array(rng.standard_normal((1, tv, 128), np.float32)), sigma=mx.array([0.8]),
        timesteps=mx.full((1, tv), 0.8), positions=P.video_positions(1, f, h, w, 24.0),
        context=mx.array(rng.standard_normal((1, 5, cfg["cross_attention_dim"]), np.float32)))
    audio = Modality(
        latent=mx.array(rng.standard_normal((1, 10, 128), np.float32)), sigma=mx.array([0.8]),
        timesteps=mx.full((1, 10), 0.8), positions=P.audio_positions(1, 10),
        context=mx.array(rng.standard_normal((1, 5, cfg["audio_cross_attention_dim"]), np.float32)))
    return video, audio


def _rel(a: mx.array, b: mx.array) -> float:
    a, b = np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32))
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_quantizable_rule():
    assert quantizable("transformer_blocks.3.attn1.to_gate_logits")
    assert quantizable("transformer.transformer_blocks.0.ff.proj_in")
    assert not quantizable("patchify_proj")
    assert not quantizable("adaln_single.linear")


# Measured on the tiny model (2 layers, 64/32 wide, random weights): q8 ~6e-3, q4 ~9e-2, bf16 ~9e-3.
@pytest.mark.parametrize("bits,tol", [(8, 2e-2), (4, 0.2)])
def test_quantized_pack_roundtrip(bits, tol):
    cfg = tiny_config()
    ref = seeded_model()
    video, audio = _inputs(cfg)
    rv, ra = ref(video, audio)

    packed = seeded_model()
    quantize_weights(packed, bits=bits, group_size=GROUP, predicate=quantizable)
    n_linear = sum(1 for p, m in ref.named_modules() if isinstance(m, nn.Linear) and quantizable(p))
    n_quant = sum(1 for _, m in packed.named_modules() if isinstance(m, nn.QuantizedLinear))
    assert n_quant == n_linear > 0  # every block Linear quantized, gate logits included
    weights = dict(tree_flatten(packed.parameters()))
    assert all(quantizable(k.rsplit(".", 2)[0]) for k in weights if k.endswith(".scales"))

    loaded = apply_weights(LTXModel(TransformerConfig.from_weights({"transformer": cfg}, weights)), weights,
                           file="tiny-q")
    qv, qa = loaded(video, audio)
    ev, ea = _rel(qv, rv), _rel(qa, ra)
    print(f"q{bits}: video {ev:.2e} audio {ea:.2e}")
    assert ev <= tol and ea <= tol


def test_bf16_weights_keep_float32_positions():
    cfg = tiny_config()
    ref = seeded_model()
    video, audio = _inputs(cfg)
    rv, ra = ref(video, audio)
    half = seeded_model()
    half.set_dtype(mx.bfloat16)
    hv, ha = half(video, audio)
    assert hv.dtype == mx.float32  # output follows the latent's dtype
    ev, ea = _rel(hv, rv), _rel(ha, ra)
    print(f"bf16: video {ev:.2e} audio {ea:.2e}")
    assert ev <= 3e-2 and ea <= 3e-2
