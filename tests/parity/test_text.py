"""Parity of the text path with the reference: ltx_core's feature extractor + connectors, HF Gemma 3."""

import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from ltx_core.text_encoders.gemma.embeddings_connector import (  # noqa: E402
    AudioEmbeddings1DConnectorConfigurator,
    Embeddings1DConnectorConfigurator,
)
from ltx_core.text_encoders.gemma.embeddings_processor import EmbeddingsProcessor  # noqa: E402
from ltx_core.text_encoders.gemma.feature_extractor import FeatureExtractorV2  # noqa: E402

from ltx_engine.loading.loader import PackError, apply_weights  # noqa: E402
from ltx_engine.models.connector import TextConnector  # noqa: E402
from ltx_engine.models.connector_config import ConnectorConfig, tiny_connector_config  # noqa: E402
from ltx_engine.models.text_encoder import (  # noqa: E402
    TextEncoder,
    gemma_hidden_states,
    tiny_gemma_config,
    write_tiny_text_encoder,
)

GEMMA_HIDDEN, GEMMA_LAYERS, VIDEO_DIM, AUDIO_DIM = 24, 3, 32, 16
SEQ, VALID = 256, 37


def rel_l2(ours, ref) -> float:
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter and buffer (several are created with torch.empty or fixed values)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            if tensor.is_floating_point():
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.3)


def _reference(transformer_cfg: dict, seed: int, gemma: tuple[int, int] = (GEMMA_HIDDEN, GEMMA_LAYERS),
               dims: tuple[int, int] = (VIDEO_DIM, AUDIO_DIM)) -> EmbeddingsProcessor:
    """The reference text path for a Gemma of `gemma` = (width, layers) and DiT widths `dims`."""
    cfg = {"transformer": transformer_cfg}
    flat = gemma[0] * (gemma[1] + 1)
    extractor = FeatureExtractorV2(
        video_aggregate_embed=torch.nn.Linear(flat, dims[0], bias=True),
        embedding_dim=gemma[0],
        audio_aggregate_embed=torch.nn.Linear(flat, dims[1], bias=True),
    )
    ref = EmbeddingsProcessor(
        feature_extractor=extractor,
        video_connector=Embeddings1DConnectorConfigurator.from_config(cfg),
        audio_connector=AudioEmbeddings1DConnectorConfigurator.from_config(cfg),
    ).float()
    _randomize(ref, seed)
    return ref.eval()


def _checkpoint_keys(ref: EmbeddingsProcessor) -> dict[str, mx.array]:
    """Reference module keys -> the official single-file checkpoint's names."""
    renames = {
        "feature_extractor.": "text_embedding_projection.",
        "video_connector.": "model.diffusion_model.video_embeddings_connector.",
        "audio_connector.": "model.diffusion_model.audio_embeddings_connector.",
    }
    out = {}
    for key, value in ref.state_dict().items():
        for old, new in renames.items():
            if key.startswith(old):
                out[new + key[len(old):]] = mx.array(value.detach().numpy())
    return out


CASES = {
    "ltx23_split_f64": {"rope_type": "split", "frequencies_precision": "float64"},
    "interleaved_f32": {"rope_type": "interleaved", "frequencies_precision": "float32",
                        "connector_apply_gated_attention": False},
}


def _compare(ref: EmbeddingsProcessor, ours: TextConnector, gemma: tuple[int, int] = (GEMMA_HIDDEN, GEMMA_LAYERS),
             dims: tuple[int, int] = (VIDEO_DIM, AUDIO_DIM)) -> list[float]:
    """Rel. L2 of (video features, audio features, video context, audio context); masks must agree."""
    rng = np.random.default_rng(2)
    states = [rng.standard_normal((1, SEQ, gemma[0])).astype(np.float32) * (i + 1) for i in range(gemma[1] + 1)]
    mask = np.zeros((1, SEQ), dtype=np.int64)
    mask[:, SEQ - VALID:] = 1  # left padding, as the reference tokenizer

    with torch.no_grad():
        t_states = tuple(torch.from_numpy(s) for s in states)
        t_mask = torch.from_numpy(mask)
        ref_video_feats, ref_audio_feats = ref.feature_extractor(t_states, t_mask, "left")
        ref_out = ref.process_hidden_states(t_states, t_mask, "left")

    m_states = [mx.array(s) for s in states]
    m_mask = mx.array(mask.astype(np.int32))
    video_feats, audio_feats = ours.text_embedding_projection(m_states, m_mask)
    video, audio, out_mask = ours(m_states, m_mask)
    assert video.shape == (1, SEQ, dims[0]) and audio.shape == (1, SEQ, dims[1])
    np.testing.assert_array_equal(np.array(out_mask), ref_out.attention_mask.numpy())
    return [rel_l2(video_feats, ref_video_feats.numpy()), rel_l2(audio_feats, ref_audio_feats.numpy()),
            rel_l2(video, ref_out.video_encoding.numpy()), rel_l2(audio, ref_out.audio_encoding.numpy())]


@pytest.mark.parametrize("case", list(CASES))
def test_connector_matches_reference(case: str) -> None:
    transformer_cfg = {**tiny_connector_config(GEMMA_HIDDEN, GEMMA_LAYERS, VIDEO_DIM, AUDIO_DIM), **CASES[case]}
    ref = _reference(transformer_cfg, seed=1)
    ours = TextConnector(ConnectorConfig.from_config({"transformer": transformer_cfg}))
    apply_weights(ours, TextConnector.sanitize(_checkpoint_keys(ref)), file="connector(test)")
    errs = _compare(ref, ours)
    print("connector", case, errs)
    assert max(errs) <= 1e-4


# A pack converted with another Gemma (40 wide, 5 layers) at non-default connector sizes (video 4 heads x
# 12, 3 blocks; audio 2 heads x 12, 1 block; 64 registers), whose config keys still describe the default
# tiny text path: the sizes must come from the weight shapes, the keys are only a fallback.
OTHER_GEMMA, OTHER_DIMS = (40, 5), (48, 24)
OTHER_SIZES = {
    "connector_num_attention_heads": 4, "connector_attention_head_dim": 12, "connector_num_layers": 3,
    "audio_connector_num_attention_heads": 2, "audio_connector_attention_head_dim": 12,
    "audio_connector_num_layers": 1,
}


def test_connector_sizes_come_from_the_weights() -> None:
    true_cfg = {**tiny_connector_config(*OTHER_GEMMA, *OTHER_DIMS), **OTHER_SIZES}
    ref = _reference(true_cfg, seed=4, gemma=OTHER_GEMMA, dims=OTHER_DIMS)
    with torch.no_grad():
        for connector in (ref.video_connector, ref.audio_connector):  # 64 registers, not the default 128
            connector.num_learnable_registers = 64
            connector.learnable_registers = torch.nn.Parameter(connector.learnable_registers[:64].clone())
    weights = TextConnector.sanitize(_checkpoint_keys(ref))
    stale = {"transformer": tiny_connector_config(GEMMA_HIDDEN, GEMMA_LAYERS, VIDEO_DIM, AUDIO_DIM)}
    with pytest.raises(PackError, match="connector.safetensors"):  # the keys alone cannot load this pack
        apply_weights(TextConnector.from_config(stale), weights, file="connector.safetensors")
    ours = apply_weights(TextConnector.from_weights(stale, weights), weights, file="connector.safetensors")
    c = ours.cfg
    assert (c.text_features, c.video_dim, c.audio_dim) == (40 * 6, 48, 24)
    assert (c.video_heads, c.video_head_dim, c.video_layers) == (4, 12, 3)
    assert (c.audio_heads, c.audio_head_dim, c.audio_layers, c.num_learnable_registers) == (2, 12, 1, 64)
    errs = _compare(ref, ours, OTHER_GEMMA, OTHER_DIMS)
    print("connector sizes from weights", errs)
    assert max(errs) <= 1e-4


def test_gemma_hidden_states_match_transformers(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    write_tiny_text_encoder(tmp_path, seed=3)
    encoder = TextEncoder.load(tmp_path, max_length=64)
    prompt = "A slow aerial shot over a misty forest at sunrise, birds flying, warm golden light on the trees."
    ids, mask = encoder.tokenize(prompt)
    n_valid = int(mask.sum())
    cfg = tiny_gemma_config()
    assert cfg["sliding_window"] < n_valid < 64  # both masks and the padding matter

    ours = gemma_hidden_states(encoder.model, ids, mask)

    hf_cfg = transformers.Gemma3TextConfig(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    hf = transformers.Gemma3ForCausalLM(hf_cfg).float().eval()
    weights = mx.load(str(tmp_path / "model.safetensors"))
    state = {k: torch.from_numpy(np.array(v)) for k, v in weights.items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    hf.config._attn_implementation = "eager"
    with torch.no_grad():
        out = hf.model(
            input_ids=torch.from_numpy(np.array(ids)).long(),
            attention_mask=torch.from_numpy(np.array(mask)).long(),
            output_hidden_states=True,
        )
    assert len(out.hidden_states) == len(ours) == cfg["num_hidden_layers"] + 1
    for layer, (a, b) in enumerate(zip(ours, out.hidden_states, strict=True)):
        err = rel_l2(np.array(a)[:, -n_valid:], b.numpy()[:, -n_valid:])
        assert err <= 1e-4, f"hidden state {layer}: rel L2 {err:.2e}"
