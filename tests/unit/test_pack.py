"""Packs go through one strict loader: tiny bf16/q8/q4 packs load, broken packs name the key and file."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine.loading.loader import PackError
from ltx_engine.loading.pack import Pack
from ltx_engine.loading.registry import ModelRegistry
from ltx_engine.tiny.tiny_pack import write_tiny_pack


def _dit_output(folder) -> np.ndarray:
    """The tiny DiT's video velocity on fixed inputs, loaded through the registry as workers do."""
    from ltx_engine.denoise import modality

    pack = Pack(folder)
    model = ModelRegistry().get(pack, "transformer")
    cfg = pack.config["transformer"]
    rng = np.random.default_rng(0)
    tokens = 24
    latent = rng.standard_normal((1, tokens, cfg["in_channels"])).astype(np.float32)
    positions = np.stack([np.arange(tokens), np.arange(tokens) + 1], -1)[None, None].repeat(3, 1).astype(np.float32)
    context = rng.standard_normal((1, 8, cfg["cross_attention_dim"])).astype(np.float32)
    v_mod = modality(latent, np.full((1, tokens), 0.5, np.float32), positions, 0.5, context, None)
    out, _ = model(v_mod, None)
    return np.array(out.astype(mx.float32))


def test_quantized_tiny_packs_stay_close_to_bf16(tmp_path):
    outputs = {}
    for bits in (None, 8, 4):
        folder = write_tiny_pack(tmp_path / f"pack-{bits}", seed=0, bits=bits)
        if bits:
            assert json.loads((folder / "quantize_config.json").read_text())["bits"] == bits
        outputs[bits] = _dit_output(folder)
    ref = outputs[None]
    rel = {bits: float(np.linalg.norm(outputs[bits] - ref) / np.linalg.norm(ref)) for bits in (8, 4)}
    print(f"tiny DiT rel. L2 vs bf16: q8 {rel[8]:.4f}, q4 {rel[4]:.4f}")
    assert rel[8] < 0.05 and rel[4] < 0.3


@pytest.mark.timeout(120)
def test_bench_dit_pack_loads_its_wide_dit_and_quantizes_every_block_linear(tmp_path):
    """`farm pack tiny --dit bench`: the same files and loader with the DiT at DIT_SIZES["bench"]; the
    text context comes at the DiT's width, and q8 quantizes every block Linear (widths multiples of 32)."""
    import mlx.nn as nn

    from ltx_engine.tiny.tiny_pack import DIT_SIZES

    size = DIT_SIZES["bench"]
    for bits in (None, 8):
        folder = write_tiny_pack(tmp_path / f"bench-{bits}", seed=0, bits=bits, dit="bench")
        cfg = Pack(folder).config["transformer"]
        assert {k: cfg[k] for k in size} == size
        assert cfg["cross_attention_dim"] == size["num_attention_heads"] * size["attention_head_dim"]
        out = _dit_output(folder)
        assert out.shape == (1, 24, cfg["out_channels"]) and np.isfinite(out).all()
    model = ModelRegistry().get(Pack(folder), "transformer")
    linears = [(name, m) for name, m in model.named_modules()
               if name.startswith("transformer_blocks.") and isinstance(m, nn.Linear | nn.QuantizedLinear)]
    plain = [name for name, m in linears if not isinstance(m, nn.QuantizedLinear)]
    assert linears and not plain, plain[:3]


@pytest.fixture
def broken(tmp_path, tiny_packs):
    folder = tmp_path / "pack"
    shutil.copytree(tiny_packs / "tiny", folder)
    return folder


def _rewrite(path, change) -> None:
    tensors = dict(mx.load(str(path)))
    change(tensors)
    mx.save_safetensors(str(path), tensors)


def test_missing_tensor_names_key_and_file(broken):
    path = broken / "vae_decoder.safetensors"
    _rewrite(path, lambda t: t.pop(sorted(t)[0]))
    with pytest.raises(PackError, match=r"vae_decoder\.safetensors: missing tensor"):
        ModelRegistry().get(Pack(broken), "vae_decoder")


def test_wrong_shape_names_key_and_file(broken):
    path = broken / "transformer-distilled.safetensors"
    key = "transformer.proj_out.weight"
    _rewrite(path, lambda t: t.__setitem__(key, mx.zeros((3, 3), dtype=mx.bfloat16)))
    with pytest.raises(PackError, match=r"transformer-distilled\.safetensors: tensor 'proj_out\.weight' has shape"):
        ModelRegistry().get(Pack(broken), "transformer")


def test_unknown_file_is_skipped_with_one_warning(broken, caplog):
    (broken / "mystery.safetensors").write_bytes(b"")
    (broken / "notes.txt").write_text("x")
    with caplog.at_level("WARNING", logger="ltx_engine.loading.pack"):
        pack = Pack(broken)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "mystery.safetensors" in lines[0] and "notes.txt" in lines[0]
    assert pack.has("transformer")


def test_missing_optional_component_refuses_only_itself(broken):
    (broken / "vocoder.safetensors").unlink()
    pack = Pack(broken)
    assert not pack.has("vocoder") and "vocoder" not in pack.components()
    assert pack.missing("vocoder").startswith("pack ") and "vocoder.safetensors" in pack.missing("vocoder")
    with pytest.raises(PackError, match=r"has no vocoder \(vocoder\.safetensors\): get it with `mlx-forge"):
        ModelRegistry().get(pack, "vocoder")
    ModelRegistry().get(pack, "audio_vae")  # the rest still serves
