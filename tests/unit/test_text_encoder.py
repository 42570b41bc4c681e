"""The prompt -> context chain on the tiny Gemma + tiny tokenizer + tiny connector (no downloads)."""

import json

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine.loading.loader import PackError, apply_weights
from ltx_engine.models.connector import TextConnector, tiny_connector_weights
from ltx_engine.models.connector_config import ConnectorConfig, tiny_connector_config
from ltx_engine.models.text_encoder import (
    REFERENCE_MAX_LENGTH,
    TextEncoder,
    encode_prompt,
    tiny_gemma_config,
    write_tiny_text_encoder,
)
from ltx_engine.tiny.tiny_tokenizer import tiny_vocab_size, write_tiny_tokenizer

VIDEO_DIM, AUDIO_DIM = 32, 16
PROMPT = "A red fox runs through the snowy forest at sunset, camera tracking slowly."


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> TextEncoder:
    folder = write_tiny_text_encoder(tmp_path_factory.mktemp("gemma"), seed=0)
    return TextEncoder.load(folder)


@pytest.fixture(scope="module")
def connector() -> TextConnector:
    gemma = tiny_gemma_config()
    cfg = ConnectorConfig.from_config(
        {"transformer": tiny_connector_config(gemma["hidden_size"], gemma["num_hidden_layers"], VIDEO_DIM, AUDIO_DIM)}
    )
    model = TextConnector(cfg)
    return apply_weights(model, tiny_connector_weights(cfg, seed=0), file="connector(tiny)")


def test_tiny_tokenizer_files_are_reproducible(tmp_path) -> None:
    a, b = write_tiny_tokenizer(tmp_path / "a"), write_tiny_tokenizer(tmp_path / "b")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert json.loads((a / "tokenizer_config.json").read_text())["pad_token"] == "<pad>"


def test_tokenize_left_pads_like_the_reference(encoder: TextEncoder) -> None:
    ids, mask = encoder.tokenize("  " + PROMPT + "  ")
    assert ids.shape == mask.shape == (1, REFERENCE_MAX_LENGTH)
    n = int(mask.sum())
    ids_np, mask_np = np.array(ids)[0], np.array(mask)[0]
    assert mask_np[-n:].all() and not mask_np[:-n].any()
    assert (ids_np[:-n] == encoder.tokenizer.pad_token_id).all()
    assert ids_np[-n] == encoder.tokenizer.bos_token_id
    assert (ids_np[-n + 1:] < tiny_vocab_size()).all() and (ids_np[-n + 1:] > 3).all()  # no <unk> here
    other, _ = encoder.tokenize("Ocean waves at night.")
    assert not np.array_equal(np.array(other), ids_np[None])


def test_long_prompt_is_truncated_on_the_right(encoder: TextEncoder) -> None:
    ids, mask = encoder.tokenize("the sun " * 2000)
    assert int(mask.sum()) == REFERENCE_MAX_LENGTH
    assert int(ids[0, 0]) == encoder.tokenizer.bos_token_id


def test_hidden_states_shapes(encoder: TextEncoder) -> None:
    states, mask = encoder.hidden_states(PROMPT)
    cfg = tiny_gemma_config()
    assert len(states) == cfg["num_hidden_layers"] + 1
    assert all(s.shape == (1, REFERENCE_MAX_LENGTH, cfg["hidden_size"]) for s in states)
    assert all(bool(mx.isfinite(s).all()) for s in states)
    assert mask.shape == (1, REFERENCE_MAX_LENGTH)


def test_encode_prompt_chain(encoder: TextEncoder, connector: TextConnector) -> None:
    out = encode_prompt(encoder, connector, PROMPT)
    assert set(out) == {"video_context", "audio_context", "context_mask"}
    assert out["video_context"].shape == (1, REFERENCE_MAX_LENGTH, VIDEO_DIM)
    assert out["audio_context"].shape == (1, REFERENCE_MAX_LENGTH, AUDIO_DIM)
    assert out["context_mask"].shape == (1, REFERENCE_MAX_LENGTH)
    for value in out.values():
        assert value.dtype == np.float32 and np.isfinite(value).all()
    # Learnable registers fill the padding, so every context token is valid (as the reference).
    assert (out["context_mask"] == 1).all()

    again = encode_prompt(encoder, connector, PROMPT)
    for key in out:
        np.testing.assert_array_equal(out[key], again[key])
    other = encode_prompt(encoder, connector, "Ocean waves at night.")
    assert not np.allclose(other["video_context"], out["video_context"])


def test_same_seed_same_weights(tmp_path) -> None:
    a = write_tiny_text_encoder(tmp_path / "a", seed=5)
    b = write_tiny_text_encoder(tmp_path / "b", seed=5)
    wa, wb = mx.load(str(a / "model.safetensors")), mx.load(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(bool(mx.array_equal(wa[k], wb[k])) for k in wa)


def test_sanitize_official_and_pack_keys(connector: TextConnector) -> None:
    cfg = connector.cfg
    ours = tiny_connector_weights(cfg, seed=1)
    official = {}
    for key, value in ours.items():
        prefix = "" if key.startswith("text_embedding_projection.") else "model.diffusion_model."
        official[prefix + key] = value
    official["model.diffusion_model.transformer_blocks.0.attn1.to_q.weight"] = mx.zeros((2, 2))
    official["vae.decoder.conv_in.weight"] = mx.zeros((1,))
    assert TextConnector.sanitize(official).keys() == ours.keys()
    assert TextConnector.sanitize(ours).keys() == ours.keys()
    # pack files keep PyTorch's list names
    assert "video_embeddings_connector.transformer_1d_blocks.0.attn1.to_out.0.weight" in ours
    assert "audio_embeddings_connector.transformer_1d_blocks.1.ff.net.2.bias" in ours
    broken = dict(ours)
    broken.pop("video_embeddings_connector.learnable_registers")
    with pytest.raises(PackError, match="learnable_registers"):
        apply_weights(TextConnector(cfg), broken, file="connector.safetensors")


def test_v1_config_is_refused() -> None:
    with pytest.raises(NotImplementedError):
        ConnectorConfig.from_config({"transformer": {}})


def test_connector_refuses_another_text_encoder_in_one_line(connector: TextConnector) -> None:
    gemma = tiny_gemma_config()
    states = [mx.zeros((1, 128, gemma["hidden_size"]))] * gemma["num_hidden_layers"]  # one hidden state short
    with pytest.raises(ValueError, match=r"reads 256 text features per token \(4 hidden states of width 64\); "
                                         r"the text encoder gave 3 hidden states x 64"):
        connector(states, mx.ones((1, 128), dtype=mx.int32))


def test_registry_takes_connector_sizes_from_the_weights(tiny_packs, tmp_path) -> None:
    """A pack whose config keys disagree with its connector file (another Gemma's width and depth, other
    connector depth, head width and registers) loads through the registry at the file's sizes."""
    import shutil

    from ltx_engine.loading.pack import open_pack
    from ltx_engine.loading.registry import ModelRegistry

    folder = shutil.copytree(tiny_packs / "tiny", tmp_path / "stale")
    cfg = json.loads((folder / "embedded_config.json").read_text())
    cfg["transformer"].update(text_encoder_hidden_size=3840, text_encoder_num_hidden_layers=48, connector_num_layers=5,
                              audio_connector_num_layers=7, connector_attention_head_dim=128,
                              audio_connector_attention_head_dim=128, connector_num_learnable_registers=16)
    (folder / "embedded_config.json").write_text(json.dumps(cfg))
    stale, good = open_pack(folder), open_pack(tiny_packs / "tiny")
    with pytest.raises(PackError, match="connector"):  # the config keys alone would refuse this pack
        apply_weights(TextConnector.from_config(stale.config), stale.tensors("connector"), file="connector")
    registry = ModelRegistry()
    loaded = registry.get(stale, "connector")
    assert loaded.cfg == registry.get(good, "connector").cfg
    encoder = registry.get(good, "text_encoder")
    out, want = encode_prompt(encoder, loaded, PROMPT), encode_prompt(encoder, registry.get(good, "connector"), PROMPT)
    for key in want:
        np.testing.assert_array_equal(out[key], want[key])
