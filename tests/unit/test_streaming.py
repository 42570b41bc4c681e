"""Block streaming: the streamed DiT forward equals the resident one bit for bit (tiny pack: bf16, q8, q4,
a stacked LoRA set on q8), and a pack file that goes away or shrinks mid-forward fails with its name."""

from __future__ import annotations

import os
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine.loading.loader import PackError
from ltx_engine.loading.pack import Pack
from ltx_engine.loading.registry import ModelRegistry
from ltx_engine.loading.streaming import StreamedLTX, StreamedPack, can_stream
from ltx_engine.lora.lora import WithLoras
from ltx_engine.models import patchify as P
from ltx_engine.models.transformer import Modality
from ltx_engine.rules.guidance import Perturbation
from ltx_engine.tiny.tiny_loras import tiny_lora_factors, write_tiny_lora
from ltx_engine.tiny.tiny_pack import write_tiny_pack

pytestmark = pytest.mark.timeout(60)


def _inputs(cfg: dict) -> tuple[Modality, Modality]:
    rng = np.random.default_rng(7)
    f, h, w = 2, 4, 6
    tv = f * h * w
    t = cfg["transformer"]
    video = Modality(
        latent=mx.array(rng.standard_normal((1, tv, 128), np.float32)), sigma=mx.array([0.7]),
        timesteps=mx.full((1, tv), 0.7), positions=P.video_positions(1, f, h, w, 24.0),
        context=mx.array(rng.standard_normal((1, 5, t["num_attention_heads"] * t["attention_head_dim"]), np.float32)))
    audio = Modality(
        latent=mx.array(rng.standard_normal((1, 10, 128), np.float32)), sigma=mx.array([0.7]),
        timesteps=mx.full((1, 10), 0.7), positions=P.audio_positions(1, 10),
        context=mx.array(rng.standard_normal(
            (1, 5, t["audio_num_attention_heads"] * t["audio_attention_head_dim"]), np.float32)))
    return video, audio


def _forward(model, cfg, perturbation=None):
    v, a = model(*_inputs(cfg), perturbation)
    mx.eval(v, a)
    return np.array(v.astype(mx.float32)), np.array(a.astype(mx.float32))


def _lora_pack(root: Path) -> tuple[tuple[str, float], ...]:
    """Two LoRAs (two layouts) stacked on block 0's and block 1's layers."""
    shapes = {"transformer_blocks.0.attn1.to_q": (64, 64), "transformer_blocks.1.ff.net.0.proj": (256, 64),
              "transformer_blocks.1.audio_attn1.to_k": (32, 32)}
    write_tiny_lora(root / "style-lora.safetensors", tiny_lora_factors(shapes, seed=1))
    write_tiny_lora(root / "camera-lora.safetensors", tiny_lora_factors(shapes, seed=2), "comfyui", alpha=2.0)
    return (("style-lora.safetensors", 0.8), ("camera-lora.safetensors", 0.4))


@pytest.mark.parametrize("bits, loras", [(None, False), (8, False), (4, False), (8, True)],
                         ids=["bf16", "q8", "q4", "q8-lora-set"])
def test_streamed_forward_is_bit_identical_to_resident(tmp_path, bits, loras):
    write_tiny_pack(tmp_path / "p", seed=0, bits=bits)
    pack = Pack(tmp_path / "p")
    if loras:
        pack = WithLoras(pack, _lora_pack(tmp_path / "p"))
    registry = ModelRegistry()
    resident = registry.get(pack, "transformer")
    streamed = registry.get(StreamedPack(pack), "transformer")
    assert isinstance(streamed, StreamedLTX) and len(streamed.transformer_blocks) == 0
    assert streamed.num_blocks == len(resident.transformer_blocks) == 2
    want, got = _forward(resident, pack.config), _forward(streamed, pack.config)
    for w, g in zip(want, got, strict=True):
        assert np.isfinite(w).all() and np.array_equal(w, g)
    stg = Perturbation(video_self_blocks=frozenset({1}), skip_a2v=True)  # a guided pass skips per block too
    assert all(np.array_equal(w, g) for w, g in zip(_forward(resident, pack.config, stg),
                                                    _forward(streamed, pack.config, stg), strict=True))
    if loras:  # the set really changed the model: the plain pack's forward differs
        plain = _forward(registry.get(pack.pack, "transformer"), pack.config)
        assert not np.array_equal(plain[0], want[0])


def _block_file(pack: Pack) -> Path:
    return pack.stream_parts("transformer")["files"][0]


def test_a_pack_file_that_disappears_while_streaming_is_named(tmp_path):
    write_tiny_pack(tmp_path / "p", seed=0, bits=8)
    pack = Pack(tmp_path / "p")
    streamed = ModelRegistry().get(StreamedPack(pack), "transformer")
    path = _block_file(pack)
    os.unlink(path)
    with pytest.raises(PackError, match=rf"{path}: cannot read while streaming"):
        _forward(streamed, pack.config)


def test_a_pack_file_truncated_while_streaming_is_named(tmp_path):
    write_tiny_pack(tmp_path / "p", seed=0)
    pack = Pack(tmp_path / "p")
    streamed = ModelRegistry().get(StreamedPack(pack), "transformer")
    path = _block_file(pack)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(PackError, match=rf"{path}: tensor '.*' ends at byte \d+ but the file has {size // 2} "
                                        r"\(truncated while streaming\)"):
        _forward(streamed, pack.config)


def test_the_engine_streams_a_pack_folder_through_lora_views_only(tmp_path):
    from ltx_engine.engine import Engine

    write_tiny_pack(tmp_path / "p", seed=0)
    pack = Pack(tmp_path / "p")
    assert can_stream(pack) and can_stream(WithLoras(pack, ())) and can_stream(StreamedPack(pack))
    assert not can_stream(WithLoras(object(), ()))  # e.g. a single-file checkpoint: resident
    engine = Engine(ModelRegistry())
    engine.stream_blocks = True
    assert isinstance(engine.model(pack, "transformer"), StreamedLTX)
    assert not isinstance(engine.model(pack, "connector"), StreamedLTX)


def test_a_worker_lora_view_with_detailing_on_top_streams_bit_identical(tmp_path):
    """The views a worker stacks (worker/loras.FusedLoras, then DFR's detailing WithLoras over it) stream
    the same set in the same order as the resident build fuses it."""
    from worker.loras import FusedLoras

    write_tiny_pack(tmp_path / "p", seed=0, bits=8)
    (style, s1), (camera, s2) = _lora_pack(tmp_path / "p")
    pack = Pack(tmp_path / "p")
    view = WithLoras(FusedLoras(pack, ((str(tmp_path / "p" / style), s1),), "set", [0]), ((camera, s2),))
    registry = ModelRegistry()
    want = _forward(registry.get(view, "transformer"), pack.config)
    got = _forward(registry.get(StreamedPack(view), "transformer"), pack.config)
    assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))


def _grid_inputs(cfg: dict, grid=(4, 32, 32)) -> tuple[Modality, Modality, np.ndarray]:
    """`grid`'s video tokens (4096: the smallest forward sparse attention routes) and a short audio stream."""
    video, audio = _inputs(cfg)
    rng = np.random.default_rng(11)
    tv = int(np.prod(grid))
    positions = P.video_positions(1, *grid, 24.0)
    video = Modality(latent=mx.array(rng.standard_normal((1, tv, 128), np.float32)), sigma=video.sigma,
                     timesteps=mx.full((1, tv), 0.7), positions=positions, context=video.context)
    return video, audio, np.array(positions, np.float32)


@pytest.mark.timeout(180)
def test_a_streamed_forward_takes_the_renders_sparse_attention_and_compute_dtype(tmp_path):
    """The per-forward settings reach blocks bound during the forward, as they reach resident
    ones: sparse stage-2 attention and float16 compute give the resident model's bits streamed too.
    The settings with sparse attention run on 4096 video tokens (the fewest it routes); float16 alone and
    the plain forward need no such size, so they run on 2x4x6 tokens (each 4096-token forward is costly)."""
    from ltx_engine.models.forward_options import ForwardOptions, run

    write_tiny_pack(tmp_path / "p", seed=0)
    pack = Pack(tmp_path / "p")
    registry = ModelRegistry()
    resident = registry.get(pack, "transformer")
    streamed = registry.get(StreamedPack(pack), "transformer")

    def forward(model, options, grid):
        video, audio, positions = _grid_inputs(pack.config, grid)

        def call():
            v, a = model(video, audio)
            mx.eval(v, a)
            return v, a
        v, a = run(model, call, options, positions)
        return np.array(v.astype(mx.float32)), np.array(a.astype(mx.float32))

    for grid, settings in (((4, 32, 32), (ForwardOptions(sparse_tau=1.0),
                                          ForwardOptions(sparse_tau=1.0, compute_dtype="float16"))),
                           ((2, 4, 6), (ForwardOptions(compute_dtype="float16"),))):
        plain = forward(resident, None, grid)
        for options in settings:
            want, got = forward(resident, options, grid), forward(streamed, options, grid)
            assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True)), options
            assert not np.array_equal(want[0], plain[0]), options  # the setting really changed the forward
    assert all(np.array_equal(w, g) for w, g in zip(plain, forward(streamed, None, grid), strict=True))
