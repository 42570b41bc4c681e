"""Every pack layout mlx-forge writes or the published repos hold loads by key through `open_pack` and
the registry; what a layout lacks is refused alone, with the line that says how to get it; broken
files are named with their key."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from ltx_engine.loading.loader import PackError
from ltx_engine.loading.pack import open_pack
from ltx_engine.loading.registry import ModelRegistry
from ltx_engine.tiny.tiny_layouts import LAYOUTS, LORA_FILE
from ltx_engine.tiny.tiny_pack import write_tiny_pack

# The components whose files a layout renames, shards, versions or fuses: built through the registry
# and compared, parameter by parameter, with the standard layout's models.
VARYING = ("transformer", "spatial_upscaler")
LOSSLESS = ("legacy", "versioned", "sharded", "hf-cache", "published-2.3", "extras")


@pytest.fixture(scope="module")
def standard_models(tiny_packs):
    pack = open_pack(tiny_packs / "tiny")
    registry = ModelRegistry()
    return {c: dict(tree_flatten(registry.get(pack, c).parameters())) for c in VARYING}


def _params(pack, component):
    return dict(tree_flatten(ModelRegistry().get(pack, component).parameters()))


def _same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(bool(mx.array_equal(a[k], b[k])) for k in a)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", LOSSLESS)
def test_lossless_layout_loads_the_same_models(layout, tmp_path, standard_models, caplog):
    with caplog.at_level("WARNING", logger="ltx_engine.loading.pack"):
        pack = open_pack(write_tiny_pack(tmp_path / "pack", seed=0, layout=layout))
    for component in VARYING:
        assert _same(_params(pack, component), standard_models[component]), (layout, component)
    warnings = [r.getMessage() for r in caplog.records]
    if layout == "extras":  # unknown files: one line, naming them; the 2.5 extras are known and silent
        assert len(warnings) == 1 and "mystery.safetensors" in warnings[0] and "notes.txt" in warnings[0]
        assert "duration_head" not in warnings[0] and "lora" not in warnings[0]
    else:
        assert warnings == []


def test_every_layout_is_tested():
    assert set(LAYOUTS) == {"standard", "dev-only", "minimal", *LOSSLESS}


def test_hf_cache_snapshot_is_symlinks_into_blobs(tmp_path):
    snapshot = write_tiny_pack(tmp_path / "cache", layout="hf-cache")
    assert snapshot.parent.name == "snapshots" and (snapshot / "embedded_config.json").is_symlink()
    assert (snapshot / "embedded_config.json").resolve().parent.name == "blobs"
    assert "text_encoder" in open_pack(snapshot).components()


def test_versioned_picks_the_newest_files(tmp_path):
    pack = open_pack(write_tiny_pack(tmp_path / "pack", layout="versioned"))
    assert pack.file_label("transformer").endswith("transformer-distilled-1.1.safetensors")
    assert pack.layout.found["spatial_upscaler"].stem == "spatial_upscaler_x2_v1_1"


def test_published_pack_serves_all_but_the_text_encoder(tmp_path):
    pack = open_pack(write_tiny_pack(tmp_path / "pack", layout="published-2.3"))
    assert "text_encoder" not in pack.components() and "transformer_dev" in pack.components()
    assert "text_encoder/" in pack.missing("text_encoder")


def test_minimal_pack_serves_its_core_and_names_the_upscalers(tmp_path):
    pack = open_pack(write_tiny_pack(tmp_path / "pack", layout="minimal"))
    assert {"transformer", "connector", "vae_decoder", "vae_encoder", "audio_vae", "vocoder"} <= set(pack.components())
    ModelRegistry().get(pack, "vae_decoder")
    assert pack.missing("spatial_upscaler").endswith("`mlx-forge convert ltx-2.3 --spatial-upscaler x2`")
    assert pack.missing("temporal_upscaler").endswith("`mlx-forge convert ltx-2.3 --temporal-upscaler x2`")


@pytest.mark.timeout(60)
def test_dev_only_pack_fuses_the_distilled_lora(tmp_path, standard_models):
    folder = write_tiny_pack(tmp_path / "pack", layout="dev-only")
    pack = open_pack(folder)
    assert "transformer" in pack.components()
    dev = dict(mx.load(str(folder / "transformer-dev.safetensors")))
    lora = dict(mx.load(str(folder / LORA_FILE)))
    fused = pack.tensors("transformer")
    a = np.array(lora["diffusion_model.transformer_blocks.0.attn1.to_out.0.lora_A.weight"].astype(mx.float32))
    b = np.array(lora["diffusion_model.transformer_blocks.0.attn1.to_out.0.lora_B.weight"].astype(mx.float32))
    w = np.array(dev["transformer.transformer_blocks.0.attn1.to_out.weight"].astype(mx.float32))
    want = mx.array(w + b @ a).astype(mx.bfloat16)  # W += 1.0 * B @ A in float32, back to the weight's dtype
    got = fused["transformer_blocks.0.attn1.to_out.weight"]
    assert got.dtype == mx.bfloat16 and bool(mx.array_equal(got, want))
    untouched = "transformer_blocks.0.attn1.to_v.weight"
    assert bool(mx.array_equal(fused[untouched], dev["transformer." + untouched]))
    params = _params(pack, "transformer")  # through the registry, close to the distilled weights it came from
    worst = max(float(mx.abs(params[k].astype(mx.float32) - standard_models["transformer"][k].astype(mx.float32)).max())
                for k in params)
    assert worst < 2e-3, worst


def test_dev_only_pack_refuses_with_the_reason(tmp_path):
    quantized = open_pack(write_tiny_pack(tmp_path / "q8", layout="dev-only", bits=8))
    assert quantized.has("transformer")  # a q8 dev DiT fuses too: dequantize, add, requantize
    assert ModelRegistry().get(quantized, "transformer") is not None
    folder = write_tiny_pack(tmp_path / "bare", layout="dev-only")
    (folder / LORA_FILE).unlink()
    bare = open_pack(folder)
    assert not bare.has("transformer") and "has no distilled LoRA" in bare.missing("transformer")


@pytest.fixture
def copy(tmp_path, tiny_packs):
    folder = tmp_path / "pack"
    shutil.copytree(tiny_packs / "tiny", folder)
    return folder


def test_truncated_file_names_file_and_key(copy):
    path = copy / "vae_decoder.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    pack = open_pack(copy)
    assert not pack.has("vae_decoder") and pack.has("transformer")
    assert pack.missing("vae_decoder").startswith(f"{path}: tensor 'vae_decoder.")
    assert "(file truncated)" in pack.missing("vae_decoder")


def test_corrupted_header_names_file(copy):
    path = copy / "connector.safetensors"
    data = bytearray(path.read_bytes())
    data[8:24] = b"\x00" * 16
    path.write_bytes(bytes(data))
    pack = open_pack(copy)
    assert not pack.has("connector") and pack.missing("connector").startswith(f"{path}: not a readable safetensors")


def test_quantized_scales_that_do_not_match_name_file_and_key(tmp_path):
    folder = write_tiny_pack(tmp_path / "q8", bits=8)
    path = folder / "transformer-distilled.safetensors"
    tensors = dict(mx.load(str(path)))
    key = "transformer.transformer_blocks.0.attn1.to_q.scales"
    tensors[key] = tensors[key][:, :-1]
    mx.save_safetensors(str(path), tensors)
    with pytest.raises(PackError, match=rf"{path}: quantized tensor 'transformer_blocks\.0\.attn1\.to_q\.scales'"):
        ModelRegistry().get(open_pack(folder), "transformer")


def test_config_that_contradicts_the_weights_names_file_and_key(copy):
    cfg = json.loads((copy / "embedded_config.json").read_text())
    cfg["transformer"]["num_layers"] += 1
    (copy / "embedded_config.json").write_text(json.dumps(cfg))
    with pytest.raises(PackError, match=r"transformer-distilled\.safetensors: missing tensor 'transformer_blocks\.2\."):
        ModelRegistry().get(open_pack(copy), "transformer")


def test_hf_cache_repo_in_the_packs_folder_serves_as_its_repo_id(tmp_path):
    from huggingface_hub import snapshot_download

    from worker.runner import Runner

    snapshot = write_tiny_pack(tmp_path / "packs", layout="hf-cache")
    # huggingface_hub itself resolves the layout, offline, to the same snapshot folder
    assert snapshot_download("farm/tiny", cache_dir=tmp_path / "packs", local_files_only=True) == str(snapshot)
    runner = Runner(tmp_path / "packs")
    assert runner.pack_names() == ["farm/tiny"]
    assert runner.pack("farm/tiny").root == snapshot
    holdings, problems = runner.pack_holdings()
    assert "transformer" in holdings["farm/tiny"] and problems == {}
