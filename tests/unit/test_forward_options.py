"""On the DiT: sparse stage-2 self-attention wired into blocks 1.. (tau = -inf is the dense model
bit for bit, block 0 stays dense), tiles route their own frame size, float16 compute and its overflow guard."""

from __future__ import annotations

import logging
import math

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine.denoise import forward_tokens
from ltx_engine.models.forward_options import ForwardOptions, step_options
from ltx_engine.models.patchify import video_positions
from ltx_engine.models.sparse_attention import frame_tokens
from ltx_engine.models.transformer import VIDEO_ONLY, LTXModel, TransformerConfig, tiny_config
from ltx_engine.rules import tdp

GRID = (4, 32, 32)  # 4096 tokens: the smallest forward that routes


def _model(layers: int = 2) -> LTXModel:
    mx.random.seed(3)
    model = LTXModel(TransformerConfig.from_config({"transformer": tiny_config() | {"num_layers": layers}}, VIDEO_ONLY))
    rng = np.random.default_rng(1)
    for block in model.transformer_blocks:  # non-zero AdaLN tables, so every sub-step matters
        block.scale_shift_table = mx.array(rng.normal(0, 0.2, block.scale_shift_table.shape).astype(np.float32))
    mx.eval(model.parameters())
    return model


def _tokens(grid=GRID) -> tuple[dict, dict]:
    rng = np.random.default_rng(7)
    t = int(np.prod(grid))
    pos = np.array(video_positions(1, *grid, 24.0), np.float32)
    tokens = {"latent": rng.normal(size=(1, t, 128)).astype(np.float32),
              "timesteps": np.full((1, t), 0.7, np.float32), "positions": pos}
    contexts = {"video_context": rng.normal(size=(1, 8, 64)).astype(np.float32)}
    return tokens, contexts


@pytest.fixture(scope="module")
def model():
    return _model()


@pytest.fixture(scope="module")
def dense(model):
    tokens, contexts = _tokens()
    return forward_tokens(model, tokens, 0.7, contexts)


@pytest.mark.timeout(120)
def test_minus_inf_forward_is_the_dense_forward_bit_for_bit(model, dense):
    tokens, contexts = _tokens()
    out = forward_tokens(model, tokens, 0.7, contexts, ForwardOptions(sparse_tau=-math.inf))
    assert np.array_equal(out, dense)


@pytest.mark.timeout(120)
def test_finite_tau_changes_blocks_after_the_first_only(model, dense):
    tokens, contexts = _tokens()
    sparse = forward_tokens(model, tokens, 0.7, contexts, ForwardOptions(sparse_tau=1.0))
    assert not np.array_equal(sparse, dense)
    assert np.max(np.abs(sparse - dense)) < 0.5 * np.max(np.abs(dense))  # an approximation, not noise
    assert all(getattr(b.attn1, "_sparse", None) is None for b in model.transformer_blocks)  # cleared after
    one = _model(layers=1)  # block 0 alone: dense whatever the tau
    assert np.array_equal(forward_tokens(one, tokens, 0.7, contexts, ForwardOptions(sparse_tau=1.0)),
                          forward_tokens(one, tokens, 0.7, contexts))


def test_each_tile_routes_its_own_frame():
    grid = (4, 32, 48)
    pos = np.array(video_positions(1, *grid, 24.0), np.float32)
    tiles = tdp.token_sets(grid, (1, 2, 2), 5, pos)
    sizes = {tile.tile.shape[1] * tile.tile.shape[2] for tile in tiles}
    assert len(sizes) > 1  # tiles of different h x w
    for tile in tiles:
        assert frame_tokens(pos[:, :, tile.gen_indices]) == tile.tile.shape[1] * tile.tile.shape[2]
    assert frame_tokens(pos) == 32 * 48


def test_step_options_pick_the_steps_tau():
    sigmas = [0.909375, 0.725, 0.421875, 0.0]
    assert step_options((1.0, 1.25, 1.5), sigmas, 0.725, "float16") == ForwardOptions(1.25, "float16")
    assert step_options(None, sigmas, 0.725, None).plain


@pytest.mark.timeout(120)
def test_float16_compute_is_close_to_float32():
    model = _model()
    tokens, contexts = _tokens((1, 8, 8))
    full = forward_tokens(model, tokens, 0.7, contexts)
    half = forward_tokens(model, tokens, 0.7, contexts, ForwardOptions(compute_dtype="float16"))
    assert not np.array_equal(half, full)
    assert np.max(np.abs(half - full)) <= 2e-2 * np.max(np.abs(full))
    assert all(getattr(m, "_compute", None) is None for _, m in model.named_modules())


@pytest.mark.timeout(120)
def test_an_overflowing_float16_forward_is_computed_again_in_float32(caplog):
    model = _model()
    table = np.array(model.transformer_blocks[0].scale_shift_table)
    table[1] = 2e5  # attn1's AdaLN scale: its input lies beyond float16's 65,504
    model.transformer_blocks[0].scale_shift_table = mx.array(table)
    tokens, contexts = _tokens((1, 8, 8))
    full = forward_tokens(model, tokens, 0.7, contexts)
    assert np.isfinite(full).all()
    with caplog.at_level(logging.WARNING, logger="ltx_engine.models.forward_options"):
        half = forward_tokens(model, tokens, 0.7, contexts, ForwardOptions(compute_dtype="float16"))
    assert np.array_equal(half, full)
    assert any("overflowed" in r.getMessage() for r in caplog.records)
