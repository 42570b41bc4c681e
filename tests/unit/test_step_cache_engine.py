"""The step cache on the tiny DiT: a stage run in one process keeps it in memory and skips block stacks
at a loose threshold (its output then differs), a threshold under the polynomial's constant never skips
(bit-identical to no cache), and a chain of one-forward tasks handing the state on as arrays decides and
computes exactly as the in-memory chain does (what lets any worker continue a pass or a tile)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ltx_engine.denoise import build_stage_states, model_forward
from ltx_engine.engine import Engine
from ltx_engine.loading.pack import open_pack
from ltx_engine.step_cache import from_params
from tests.unit import sp_model

pytestmark = pytest.mark.timeout(120)
LOOSE = 1.0  # the port's "faster" setting: on the tiny pack (gate change ~0.2-0.4 a step) every other step skips


@pytest.fixture(scope="module")
def setup(tiny_packs):
    inputs = replace(sp_model.stage1_inputs(), sigmas=[1.0, 0.99375, 0.9875, 0.975, 0.909375, 0.725, 0.0])
    return Engine(), open_pack(tiny_packs / "tiny"), inputs


def test_stage_in_memory_skips_and_a_tight_threshold_changes_nothing(setup):
    engine, pack, inputs = setup
    plain = engine.denoise_stage1(pack, inputs)
    assert engine.cache_skips() is None
    tight = engine.denoise_stage1(pack, replace(inputs, step_cache=0.4))
    assert engine.cache_skips() == 0
    for key in plain:
        assert np.array_equal(tight[key], plain[key]), key
    loose = engine.denoise_stage1(pack, replace(inputs, step_cache=LOOSE))
    skipped = engine.cache_skips()
    assert 0 < skipped <= len(inputs.sigmas) - 3  # first and last steps always run
    assert not np.array_equal(loose["video_latent"], plain["video_latent"])


def test_a_chain_of_tasks_equals_the_in_memory_chain(setup):
    """Each forward as its own 'task': the cache rebuilt from the previous one's arrays (through a
    float32/float64 round trip, as the blob codec keeps them) gives the same velocities, step by step."""
    engine, pack, inputs = setup
    model = engine.model(pack, "transformer")
    video, audio = build_stage_states(inputs, 128)
    steps = len(inputs.sigmas) - 1
    memory = from_params({"step_cache": LOOSE, "cache_steps": steps}, {})
    arrays: dict = {}
    skips = 0
    for step in range(steps):
        sigma = float(inputs.sigmas[step])
        task = from_params({"step_cache": LOOSE, "cache_step": step, "cache_steps": steps}, arrays)
        got = model_forward(model, video, audio, sigma, inputs.contexts, cache=task)
        want = model_forward(model, video, audio, sigma, inputs.contexts, cache=memory)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), step
        arrays = {k: np.array(v) for k, v in task.to_arrays().items()}
        skips += task.skipped
        memory.next_step()
        video = replace(video, latent=video.latent + 0.01 * got[0])  # any next state: both chains see it
        audio = replace(audio, latent=audio.latent + 0.01 * got[1])
    assert skips == memory.skipped > 0 and arrays == {}  # the last step hands nothing on
