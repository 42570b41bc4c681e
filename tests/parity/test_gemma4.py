"""Parity of LTX-2.5's text path: the Gemma 4 tower, upstream's Gemma 4 tokenization, and the 2.5
connector, on the tiny 2.5 pack (`farm pack tiny --variant 2.5`, the real file layout).

ltx-core 1.0.0 (the installed reference) has no Gemma 4 path, so the references are: transformers'
`Gemma4TextModel` for the tower's hidden states; main's tokenizer and connector-input rules written
from upstream's formulas in `tests/parity/upstream_rules.py`; and 1.0.0's `FeatureExtractorV2` and
`Embeddings1DConnector` blocks (unchanged in main except the bias-free feed-forward 2.5 uses, held at
zero). All float32, rel. L2 <= 1e-4.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

transformers = pytest.importorskip("transformers")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from ltx_core.text_encoders.gemma.embeddings_connector import (  # noqa: E402
    AudioEmbeddings1DConnectorConfigurator,
    Embeddings1DConnectorConfigurator,
)
from ltx_core.text_encoders.gemma.feature_extractor import FeatureExtractorV2  # noqa: E402

from ltx_engine.loading.pack import Pack  # noqa: E402
from ltx_engine.loading.registry import ModelRegistry  # noqa: E402
from ltx_engine.models.gemma4 import Gemma4Tower, gemma4_hidden_states, split_tower_weights, tokenize  # noqa: E402
from ltx_engine.models.text_encoder import encode_prompt  # noqa: E402
from tests.parity.upstream_rules import (  # noqa: E402
    connector_inputs_main,
    gemma_tokenize_main,
    without_ff_bias,
)

PROMPT = "  A slow aerial shot over a misty forest at sunrise, birds flying, warm golden light on the trees.  "


def rel_l2(ours, ref) -> float:
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module")
def pack25(tmp_path_factory) -> Pack:
    from ltx_engine.tiny.tiny_pack import write_tiny_pack  # float32 throughout: the parity bar is float32

    return Pack(write_tiny_pack(tmp_path_factory.mktemp("g4") / "tiny25", seed=2, variant="2.5", dtype=mx.float32))


def _hf_states(pack: Pack, ids: mx.array, mask: mx.array) -> tuple:
    """transformers' Gemma4TextModel with the tower's language weights: all hidden states."""
    text_cfg = json.loads((pack.root / "text_encoder_config.json").read_text())["text_config"]
    hf = transformers.Gemma4TextModel(transformers.Gemma4TextConfig(**text_cfg)).float().eval()
    lm, _ = split_tower_weights(mx.load(str(pack.root / "text_encoder.safetensors")))
    missing, unexpected = hf.load_state_dict(
        {k.removeprefix("model."): torch.from_numpy(np.array(v)) for k, v in lm.items()}, strict=False)
    assert not missing and not unexpected
    hf.config._attn_implementation = "eager"
    with torch.no_grad():
        out = hf(input_ids=torch.from_numpy(np.array(ids)).long(),
                 attention_mask=torch.from_numpy(np.array(mask)).long(), output_hidden_states=True)
    return out.hidden_states


def test_tokenization_follows_upstreams_gemma4_rule(pack25) -> None:
    """Gemma 4's tokenizer adds no <bos>: upstream prepends one, also when truncating."""
    tower = Gemma4Tower.load(pack25.root)
    assert tower.tokenizer(PROMPT.strip())["input_ids"][0] != tower.tokenizer.bos_token_id
    for length in (64, 8):
        ids, mask = tokenize(tower.tokenizer, PROMPT, length)
        ref_ids, ref_mask = gemma_tokenize_main(tower.tokenizer, PROMPT, length)
        assert np.array(ids)[0].tolist() == ref_ids and np.array(mask)[0].tolist() == ref_mask
    assert np.array(tokenize(tower.tokenizer, PROMPT, 8)[1]).sum() == 8  # truncated, <bos> kept first


def test_gemma4_hidden_states_match_transformers(pack25) -> None:
    tower = Gemma4Tower.load(pack25.root, max_length=64)
    ids, mask = tower_inputs = tokenize(tower.tokenizer, PROMPT, 64)
    n_valid = int(mask.sum())
    assert 16 < n_valid < 64  # the sliding window (16) and the padding both matter
    ours = gemma4_hidden_states(tower.model, *tower_inputs)
    ref = _hf_states(pack25, ids, mask)
    assert len(ours) == len(ref) == 4  # embeddings + 3 layers
    errs = [rel_l2(np.array(a)[:, -n_valid:], b.numpy()[:, -n_valid:]) for a, b in zip(ours, ref, strict=True)]
    print("gemma4 hidden states", errs)
    assert max(errs) <= 1e-4


def test_ltx25_text_path_matches_reference(pack25) -> None:
    """Prompt -> contexts through the pack as a worker loads it, against the reference chain."""
    tower = ModelRegistry().get(pack25, "text_encoder")
    connector = ModelRegistry().get(pack25, "connector")
    assert not connector.cfg.projection and not connector.cfg.ff_bias  # the 2.5 connector
    ours = encode_prompt(tower, connector, PROMPT)

    ids, mask = tokenize(tower.tokenizer, PROMPT)
    states = _hf_states(pack25, ids, mask)
    t_mask = torch.from_numpy(np.array(mask)).long()
    cfg = pack25.config
    _, proj = split_tower_weights(mx.load(str(pack25.root / "text_encoder.safetensors")))
    flat = proj["video_aggregate_embed.weight"].shape[1]
    extractor = FeatureExtractorV2(
        video_aggregate_embed=torch.nn.Linear(flat, proj["video_aggregate_embed.weight"].shape[0]),
        embedding_dim=states[0].shape[-1],
        audio_aggregate_embed=torch.nn.Linear(flat, proj["audio_aggregate_embed.weight"].shape[0])).float()
    extractor.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in proj.items()})
    connectors = {"video": Embeddings1DConnectorConfigurator.from_config(cfg).float(),
                  "audio": AudioEmbeddings1DConnectorConfigurator.from_config(cfg).float()}
    weights = pack25.tensors("connector")
    for name, module in connectors.items():
        prefix = f"{name}_embeddings_connector."
        own = {k.removeprefix(prefix): torch.from_numpy(np.array(v)) for k, v in weights.items() if k.startswith(prefix)}
        missing, unexpected = module.load_state_dict(own, strict=False)
        assert not unexpected and missing and all(".ff." in k and k.endswith(".bias") for k in missing)
        without_ff_bias(module.eval())
    with torch.no_grad():
        feats = dict(zip(("video", "audio"), extractor(states, t_mask, "left"), strict=True))
        for name, module in connectors.items():
            x = connector_inputs_main(feats[name], t_mask, module.learnable_registers)
            ref, _ = module(x, torch.zeros((1, 1, 1, x.shape[1])))
            err = rel_l2(ours[f"{name}_context"], ref.numpy())
            print("ltx-2.5 text path", name, err)
            assert err <= 1e-4
    assert ours["context_mask"].all()  # registers fill the padding: every token is valid downstream
