"""The LTX-2.5 Gemma 4 tower as packs ship it: quantized (mlx-forge quantizes its attention and MLP
Linears, recorded in quantize_config.json) it loads through the same path and stays close to bf16/float;
HF's nested key names load as the flat ones do; a pack serves the tower as its text encoder."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine.models.gemma4 import PREFIX, Gemma4Tower, write_tiny_tower
from ltx_engine.rules.text_encoders import GEMMA4_WEIGHTS, is_gemma4_tower, weight_bytes

PROMPT = "a heron lifts off a misty lake at dawn"
QUANTIZED = (".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight",
             ".self_attn.o_proj.weight", ".mlp.gate_proj.weight", ".mlp.up_proj.weight", ".mlp.down_proj.weight")


def _rel(a: mx.array, b: mx.array) -> float:
    a, b = np.array(a, dtype=np.float64), np.array(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture
def tower_dir(tmp_path):
    write_tiny_tower(tmp_path / "float", video_dim=48, audio_dim=32, seed=5)
    return tmp_path / "float"


@pytest.mark.parametrize("bits", [8, 4])
def test_a_quantized_tower_loads_and_stays_close(tower_dir, tmp_path, bits) -> None:
    folder = tmp_path / f"q{bits}"
    shutil.copytree(tower_dir, folder)
    weights = mx.load(str(folder / GEMMA4_WEIGHTS))
    out = {}
    for key, value in weights.items():
        if key.endswith(QUANTIZED):  # mlx-forge's should_quantize_gemma
            w, scales, biases = mx.quantize(value, group_size=32, bits=bits)
            out |= {key: w, key.removesuffix("weight") + "scales": scales, key.removesuffix("weight") + "biases": biases}
        else:
            out[key] = value
    mx.save_safetensors(str(folder / GEMMA4_WEIGHTS), out)
    (folder / "quantize_config.json").write_text(json.dumps({"bits": bits, "group_size": 32}))
    ref_states, mask = Gemma4Tower.load(tower_dir).hidden_states(PROMPT)
    states, mask_q = Gemma4Tower.load(folder).hidden_states(PROMPT)
    n = int(mask.sum())
    assert np.array_equal(np.array(mask), np.array(mask_q))
    errs = [_rel(a[:, -n:], b[:, -n:]) for a, b in zip(states, ref_states, strict=True)]
    print(f"q{bits} tower vs float", errs)
    assert 0 < max(errs) < (0.01 if bits == 8 else 0.1)  # measured 1.8e-3 (q8), 3.2e-2 (q4)


def test_hf_nested_names_load_like_the_flat_ones(tower_dir, tmp_path) -> None:
    folder = tmp_path / "nested"
    shutil.copytree(tower_dir, folder)
    weights = mx.load(str(folder / GEMMA4_WEIGHTS))
    nested = {(PREFIX + "model.language_model." + k.removeprefix(PREFIX + "model.")
               if k.startswith(PREFIX + "model.") else k): v for k, v in weights.items()}
    nested[PREFIX + "model.vision_tower.patch.weight"] = mx.zeros((2, 2))  # other branches are skipped
    mx.save_safetensors(str(folder / GEMMA4_WEIGHTS), nested)
    a, _ = Gemma4Tower.load(tower_dir).hidden_states(PROMPT)
    b, _ = Gemma4Tower.load(folder).hidden_states(PROMPT)
    assert all(np.array_equal(np.array(x), np.array(y)) for x, y in zip(a, b, strict=True))


def test_the_tower_counts_only_its_own_file(tower_dir) -> None:
    (tower_dir / "transformer-distilled.safetensors").write_bytes(b"\0" * 4096)  # a pack's other weights
    assert is_gemma4_tower(tower_dir)
    assert weight_bytes(tower_dir) == (tower_dir / GEMMA4_WEIGHTS).stat().st_size


def test_a_pull_for_text_takes_the_towers_files_from_a_25_listing() -> None:
    from ltx_engine.rules.components import TEXT_ENCODER, pull_files, resolve_files

    listing = ["config.json", "embedded_config.json", "connector.safetensors", "transformer-distilled.safetensors",
               "text_encoder.safetensors", "text_encoder_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "generation_config.json", "processor_config.json", "README.md"]
    got = pull_files(listing, [TEXT_ENCODER, "connector"])
    assert {"text_encoder.safetensors", "text_encoder_config.json", "tokenizer.json", "tokenizer_config.json",
            "connector.safetensors"} <= set(got) and "transformer-distilled.safetensors" not in got
    assert not resolve_files(listing).unknown  # the tower's files are known: no warning for them
    assert "tokenizer.json" not in pull_files([n for n in listing if n != "text_encoder.safetensors"], [TEXT_ENCODER])
