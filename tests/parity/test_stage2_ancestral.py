"""LTX-2.5's stage 2 samples ancestrally as upstream after 1.2.0 (tests/parity/upstream_rules.py): the
planner's rule per generation, and a tiled stage-2 step (blend, Euler-ancestral, re-noise keyed by
seed + 20000) against main's loop step on a torch float32 oracle (1.0.0 has no ancestral stepper)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

from coordinator.plan import samplers  # noqa: E402
from coordinator.plan.resolved import RenderPlan  # noqa: E402
from ltx_engine.rules import sampling, tdp  # noqa: E402
from ltx_engine.rules.generation import stage1_sampler  # noqa: E402
from ltx_engine.rules.tiling import masked_tile_output, reduce_masked_outputs  # noqa: E402
from tests.parity.test_sampling_parity import _TorchAncestralOracle  # noqa: E402
from tests.parity.upstream_rules import ANCESTRAL_ETA, ancestral_loop_step_main, ancestral_sampler_main  # noqa: E402


@pytest.mark.parametrize("generation", ["2.3", "2.5"])
def test_each_stage_samples_as_upstream_main(generation):
    main2 = ancestral_sampler_main(generation, "stage2")
    ours = samplers.stage2_params(RenderPlan.from_stored({"prompt": "x", "generation": generation}))
    assert (ours["sampler"], ours["ancestral_offset"]) == (
        main2 or (sampling.EULER, ours["ancestral_offset"])
    )
    main1 = ancestral_sampler_main(generation, "stage1")
    assert stage1_sampler(generation, dfr=True) == (main1[0] if main1 else sampling.EULER)
    assert samplers.stage2_params(RenderPlan.from_stored({"prompt": "x"})) == {}  # generation unknown: the worker picks it from its pack


def _state(rng, grid, extra):
    n = int(np.prod(grid)) + extra
    latent, clean = (rng.standard_normal((1, n, 16)).astype(np.float32) for _ in range(2))
    mask = np.ones((1, n, 1), np.float32)
    mask[:, -extra:] = 0.0  # appended conditioning tokens stay clean
    f, h, w = grid
    pos = np.zeros((1, 3, n, 2), np.float32)
    idx = np.stack(np.meshgrid(np.arange(f), np.arange(h), np.arange(w), indexing="ij")).reshape(3, -1)
    pos[0, :, : f * h * w, 0], pos[0, :, : f * h * w, 1] = idx, idx + 1
    return latent, clean, mask, pos


@pytest.mark.parametrize("step", [0, 1, 2])
def test_tiled_ancestral_step_matches_main(step):
    rng = np.random.default_rng(step)
    grid, seed, sigmas = (2, 6, 6), 7, list(sampling.STAGE_2_DISTILLED_SIGMAS)
    latent, clean, mask, pos = _state(rng, grid, 36)
    sets = tdp.token_sets(grid, (1, 2, 2), 2, pos)
    velocities = [rng.standard_normal((1, len(s.keep_indices), 16)).astype(np.float32) for s in sets]
    params = {"sampler": sampling.EULER_ANCESTRAL, "seed": seed, "ancestral_offset": 20000}
    ours = tdp.reduce_step(
        latent, clean, mask, pos, velocities, sets, sigmas, step, tdp.step_ancestral(params)
    )
    masked = [masked_tile_output(s, v) for s, v in zip(sets, velocities, strict=True)]
    blended = reduce_masked_outputs(latent.shape, sets, masked)
    ts = mask * np.float32(sigmas[step])
    denoised = torch.from_numpy(latent - blended * ts)
    noise = sampling.noise(
        latent.shape, seed + 20000, sampling.stream_id(sampling.STREAM_VIDEO_ANCESTRAL, step)
    )
    t = torch.from_numpy
    ref = ancestral_loop_step_main(
        t(latent),
        denoised,
        t(clean),
        t(mask),
        torch.tensor(sigmas),
        step,
        t(noise),
        _TorchAncestralOracle(ANCESTRAL_ETA),
    ).numpy()
    err = np.abs(ours.astype(np.float64) - ref).max() / np.abs(ref).max()
    assert err <= 1e-6, err
    assert np.array_equal(ours[:, -36:], clean[:, -36:]) or step == len(sigmas) - 2
