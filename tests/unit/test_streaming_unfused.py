"""An unfused LoRA set on a block-streamed DiT: the worker's own views and attach (worker/loras.py) give
the streamed model the set's adapters (each block's wrapped as it binds, a non-block layer's at once),
and its forward equals the resident adapted DiT's bit for bit: the tiny q8 distilled DiT, and the dev
DiT of a dev-only pack under its distilled LoRA as a guidance pass loads it (`transformer_dev`), with a
guided pass's perturbation, whole and split two ways (a gang rank's sequence-parallel forward)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine.engine import Engine
from ltx_engine.loading.pack import Pack
from ltx_engine.loading.registry import ModelRegistry
from ltx_engine.loading.streaming import StreamedLTX
from ltx_engine.lora.lora_adapters import LoraAdapter
from ltx_engine.parallel.sequence_parallel import LocalExchange, ShardPlan, sp_forward
from ltx_engine.rules.guidance import Perturbation
from ltx_engine.tiny.tiny_loras import tiny_lora_factors, write_tiny_lora
from ltx_engine.tiny.tiny_pack import write_tiny_pack
from tests.unit.test_streaming import _forward, _inputs
from worker.loras import LoraSets

pytestmark = pytest.mark.timeout(60)

SHAPES = {"transformer_blocks.0.attn1.to_q": (64, 64), "transformer_blocks.1.ff.net.0.proj": (256, 64),
          "transformer_blocks.1.audio_attn1.to_k": (32, 32), "proj_out": (128, 64)}  # the last: not a block's


def _set(root: Path) -> list[dict]:
    """Two LoRAs (two layouts) in the pack folder, as a render's set names pack files."""
    write_tiny_lora(root / "style-lora.safetensors", tiny_lora_factors(SHAPES, seed=1))
    write_tiny_lora(root / "camera-lora.safetensors", tiny_lora_factors(SHAPES, seed=2), "comfyui", alpha=2.0)
    return [{"file": "style-lora.safetensors", "strength": 0.8}, {"file": "camera-lora.safetensors", "strength": 0.4}]


def _adapted(pack_dir: Path, params: dict, component: str, streamed: bool):
    """The DiT a worker's task runs: the set's view, the engine's model (streamed or not), adapters attached."""
    engine, sets = Engine(ModelRegistry()), LoraSets()
    engine.stream_blocks = streamed
    view = sets.view(Pack(pack_dir), params)
    sets.attach(engine.model, view, (component,))
    sets.attach(engine.model, view, (component,))  # a second task on the warm DiT attaches nothing more
    assert sets.fusions == [1]
    return engine.model(view, component), Pack(pack_dir).config


@pytest.mark.parametrize("layout, component, extra", [
    ("standard", "transformer", {}),
    ("dev-only", "transformer_dev", {"distilled_lora_strength": 0.25}),
], ids=["distilled", "dev-guided-pass"])
def test_a_streamed_dit_with_an_unfused_set_equals_the_resident_one(tmp_path, layout, component, extra):
    write_tiny_pack(tmp_path / "p", seed=0, bits=8, layout=layout)
    params = {"loras": _set(tmp_path / "p"), "lora_mode": "unfused", **extra}
    resident, cfg = _adapted(tmp_path / "p", params, component, streamed=False)
    streamed, _ = _adapted(tmp_path / "p", params, component, streamed=True)
    assert isinstance(streamed, StreamedLTX) and not isinstance(resident, StreamedLTX)
    wrapped = {p for p, m in resident.named_modules() if isinstance(m, LoraAdapter)}
    assert len(wrapped) == len(SHAPES) and set(streamed.adapters) == {p for p in wrapped if p != "proj_out"}
    assert isinstance(streamed.proj_out, LoraAdapter)
    stg = Perturbation(video_self_blocks=frozenset({1}), skip_a2v=True)
    for perturbation in (None, stg):
        want, got = _forward(resident, cfg, perturbation), _forward(streamed, cfg, perturbation)
        assert all(np.isfinite(w).all() and np.array_equal(w, g) for w, g in zip(want, got, strict=True))
    video, audio = _inputs(cfg)
    split = [sp_forward(m, video, audio, LocalExchange(ShardPlan(video.latent.shape[1], 2)), stg)
             for m in (resident, streamed)]
    mx.eval(split)
    assert all(np.array_equal(np.array(w.astype(mx.float32)), np.array(g.astype(mx.float32)))
               for w, g in zip(*split, strict=True))
    bare = ModelRegistry().get(LoraSets().view(Pack(tmp_path / "p"), extra), component)  # no user set
    assert not np.array_equal(_forward(bare, cfg)[0], want[0])  # the set really changed the forward
