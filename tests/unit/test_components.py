"""The pack file table: which files make a component, which a render needs, what a pull fetches."""

from ltx_engine.rules.components import (
    PARTS,
    RENDER_KINDS,
    missing_line,
    pull_files,
    render_components,
    resolve_files,
)
from protos.kinds import KINDS

PUBLISHED = [
    "README.md", ".gitattributes", "config.json", "embedded_config.json", "quantize_config.json", "split_model.json",
    "transformer-distilled.safetensors", "transformer-distilled-1.1.safetensors", "transformer-dev.safetensors",
    "connector.safetensors", "vae_decoder.safetensors", "vae_encoder.safetensors", "audio_vae.safetensors",
    "vocoder.safetensors", "spatial_upscaler_x2_v1_0.safetensors", "spatial_upscaler_x2_v1_1.safetensors",
    "spatial_upscaler_x2_v1_1_config.json", "spatial_upscaler_x1_5_v1_0.safetensors",
    "temporal_upscaler_x2_v1_0.safetensors", "temporal_upscaler_x2_v1_0_config.json",
    "ltx-2.3-22b-distilled-lora-384.safetensors", "duration_head.safetensors", "vae_decoder_av.safetensors",
]


def test_newest_version_and_known_extras():
    layout = resolve_files(PUBLISHED + ["notes.bin"])
    assert layout.found["transformer"].files == ("transformer-distilled-1.1.safetensors",)
    assert layout.found["spatial_upscaler"].stem == "spatial_upscaler_x2_v1_1"
    assert layout.found["spatial_upscaler"].prefix == "spatial_upscaler_x2_v1_1"
    assert layout.found["transformer_dev"].prefix == "transformer"
    assert layout.unknown == ["notes.bin"]
    assert "README.md" in layout.unused
    assert layout.found["vae_decoder_av"].prefix == "vae_decoder_av"  # LTX-2.5's diffusion decoder
    assert layout.found["duration_head"].files == ("duration_head.safetensors",)  # LTX-2.5's length head


def test_shards_and_legacy_names():
    shards = [f"transformer-00{i}-of-00003.safetensors".replace("-00", "-0000", 1) for i in (1, 2, 3)]
    layout = resolve_files(shards)
    assert layout.found["transformer"].files == tuple(shards)
    broken = resolve_files(shards[:2])
    assert "transformer" not in broken.found and broken.incomplete == shards[:2]
    assert resolve_files(["transformer.safetensors"]).found["transformer"].stem == "transformer"


def test_render_needs():
    assert "vae_encoder" not in render_components({})
    assert "vae_encoder" in render_components({"image": {"blob": "x"}})
    assert "temporal_upscaler" in render_components({"temporal_upscalings": 1})
    assert "audio_vae" not in render_components({"audio": False})
    assert set(render_components({})) == set(RENDER_KINDS["t2v"])
    needed = {c for f in KINDS.values() for c in (*f.components, *f.also_needs, *f.weighs)}
    assert needed <= set(PARTS) | {"text_encoder"}


def test_diffusion_decode_needs_vae_decoder_av():
    from coordinator.plan.graph import kind_needs
    from ltx_engine.rules.components import task_needs

    needs = render_components({"video_decoder": "diffusion"})
    assert "vae_decoder_av" in needs and "vae_decoder" not in needs
    assert task_needs(("vae_decoder",), {"decoder": "diffusion"}) == ["vae_decoder_av"]
    assert task_needs(("vae_decoder",), {}) == ["vae_decoder"]
    assert kind_needs("decode_tile", {"decoder": "diffusion"}) == ["vae_decoder_av"]  # a kind's facts, adjusted
    assert kind_needs("decode_tile", {}) == ["vae_decoder"]
    assert "hf download dgrauet/ltx-2.5-mlx-q8 vae_decoder_av.safetensors" in missing_line("vae_decoder_av", "tiny")
    assert "vae_decoder_av.safetensors" in pull_files(PUBLISHED, RENDER_KINDS["diffusion"])
    assert "vae_decoder_av.safetensors" not in pull_files(PUBLISHED, RENDER_KINDS["t2v"])


def test_missing_line_names_file_and_command():
    assert missing_line("spatial_upscaler", "tiny").endswith("`mlx-forge convert ltx-2.3 --spatial-upscaler x2`")
    assert "hf download dgrauet/ltx-2.3-mlx-q8 temporal_upscaler_x2_v1_0.safetensors" in missing_line(
        "temporal_upscaler", "dgrauet/ltx-2.3-mlx-q8")


def test_pull_files_takes_only_what_kinds_need():
    files = pull_files(PUBLISHED + ["text_encoder/config.json"], RENDER_KINDS["t2v"])
    assert "transformer-distilled-1.1.safetensors" in files and "transformer-distilled.safetensors" not in files
    assert "transformer-dev.safetensors" not in files and "vae_encoder.safetensors" not in files
    assert "temporal_upscaler_x2_v1_0.safetensors" not in files and "text_encoder/config.json" in files
    assert "spatial_upscaler_x2_v1_1_config.json" in files and "embedded_config.json" in files
    dev_only = [n for n in PUBLISHED if not n.startswith("transformer-distilled")]
    assert {"transformer-dev.safetensors", "ltx-2.3-22b-distilled-lora-384.safetensors"} <= set(
        pull_files(dev_only, RENDER_KINDS["t2v"]))
