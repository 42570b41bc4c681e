"""Parity of ltx_engine.rules.sampling with the reference ltx-core (torch): relative error <= 1e-6."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

diffusion_steps = pytest.importorskip("ltx_core.components.diffusion_steps")
noisers = pytest.importorskip("ltx_core.components.noisers")
ltx_types = pytest.importorskip("ltx_core.types")
ltx_utils = pytest.importorskip("ltx_core.utils")

from ltx_engine.rules.sampling import (  # noqa: E402
    DISTILLED_SIGMAS,
    STAGE_2_DISTILLED_SIGMAS,
    LatentState,
    apply_clean,
    euler_ancestral_step,
    euler_step,
    lerp_noise,
    x0_from_velocity,
)

SIGMA_TABLES = [DISTILLED_SIGMAS, STAGE_2_DISTILLED_SIGMAS, DISTILLED_SIGMAS[4:]]


def _rel_err(ours: np.ndarray, ref: torch.Tensor) -> float:
    r = ref.detach().numpy().astype(np.float64)
    return float(np.abs(ours.astype(np.float64) - r).max() / max(np.abs(r).max(), 1e-12))


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


@pytest.mark.parametrize("sigmas", SIGMA_TABLES)
def test_euler_step_matches_reference(sigmas) -> None:
    rng = np.random.default_rng(0)
    step = diffusion_steps.EulerDiffusionStep()
    sig_t = torch.tensor(sigmas, dtype=torch.float32)
    for i in range(len(sigmas) - 1):
        x = rng.standard_normal((2, 64, 16)).astype(np.float32)
        x0 = rng.standard_normal((2, 64, 16)).astype(np.float32)
        ref = step.step(_t(x), _t(x0), sig_t, i)
        assert _rel_err(euler_step(x, x0, sigmas[i], sigmas[i + 1]), ref) <= 1e-6


class _TorchAncestralOracle:
    """Torch float32 oracle of upstream ltx-core's EulerAncestralDiffusionStep (rectified flow), used when
    the installed ltx-core (1.0.0) predates it: Euler to sigma_down, renoise to sigma_next."""

    def __init__(self, eta: float) -> None:
        self.eta = eta

    def step(self, sample, denoised, sigmas, step_index, noise):
        s, sn = sigmas[step_index].float(), sigmas[step_index + 1].float()
        if sn == 0:
            return denoised
        sd = sn * (1.0 + (sn / s - 1.0) * self.eta)
        out = (sd / s) * sample + (1.0 - sd / s) * denoised
        if self.eta > 0:
            an, ad = 1.0 - sn, 1.0 - sd
            coeff = (sn**2 - sd**2 * an**2 / ad**2).clamp(min=0) ** 0.5
            out = (an / ad) * out + noise * coeff
        return out


def test_ancestral_step_matches_reference() -> None:
    cls = getattr(diffusion_steps, "EulerAncestralDiffusionStep", _TorchAncestralOracle)
    rng = np.random.default_rng(1)
    for sigmas in SIGMA_TABLES:
        sig_t = torch.tensor(sigmas, dtype=torch.float32)
        for eta in (0.0, 0.5, 1.0):
            stepper = cls(eta=eta)
            for i in range(len(sigmas) - 1):
                x, x0, n = (rng.standard_normal((1, 32, 8)).astype(np.float32) for _ in range(3))
                ref = stepper.step(_t(x), _t(x0), sig_t, i, noise=_t(n))
                ours = euler_ancestral_step(x, x0, sigmas[i], sigmas[i + 1], eta, n)
                assert _rel_err(ours, ref) <= 1e-6


def test_noiser_matches_reference() -> None:
    """Where latent == clean (a fresh stage) the noiser is 1.0.0's `GaussianNoiser` (<= 1e-6); with a
    latent of its own it is 1.1.6's lerp rule (`upstream_rules.gaussian_noiser_1_1_6`, <= 1e-5), which
    1.0.0's misses there."""
    from tests.parity.upstream_rules import gaussian_noiser_1_1_6

    rng = np.random.default_rng(2)
    clean, latent = (rng.standard_normal((1, 40, 8)).astype(np.float32) for _ in range(2))
    mask = rng.random((1, 40, 1)).astype(np.float32)
    mask[:, :5] = 0.0
    mask[:, 5:10] = 1.0
    fresh = ltx_types.LatentState(
        latent=_t(clean), denoise_mask=_t(mask), positions=torch.zeros(1, 3, 40, 2), clean_latent=_t(clean)
    )
    own = ltx_types.LatentState(
        latent=_t(latent), denoise_mask=_t(mask), positions=torch.zeros(1, 3, 40, 2), clean_latent=_t(clean)
    )
    for sigma in (1.0, 0.909375, 0.625):
        gen = torch.Generator().manual_seed(11)
        ref = noisers.GaussianNoiser(gen)(fresh, noise_scale=sigma).latent
        n = torch.randn(1, 40, 8, generator=torch.Generator().manual_seed(11), dtype=torch.float32).numpy()
        assert _rel_err(lerp_noise(clean, clean, n, sigma, mask), ref) <= 1e-6
        got = lerp_noise(latent, clean, n, sigma, mask)
        assert _rel_err(got, gaussian_noiser_1_1_6(own, _t(n), sigma).latent) <= 1e-5
        np.testing.assert_array_equal(got[:, :5], clean[:, :5])  # mask 0: clean exactly
        if sigma < 1:
            assert _rel_err(got, noisers.GaussianNoiser(torch.Generator().manual_seed(11))(own, sigma).latent) > 1e-2


def test_x0_model_matches_reference() -> None:
    rng = np.random.default_rng(3)
    x, v = (rng.standard_normal((2, 30, 8)).astype(np.float32) for _ in range(2))
    mask = rng.random((2, 30, 1)).astype(np.float32)
    ts = mask * np.float32(0.725)
    ref = ltx_utils.to_denoised(_t(x), _t(v), _t(ts))
    assert _rel_err(x0_from_velocity(x, v, ts), ref) <= 1e-6


def test_apply_clean_matches_post_process() -> None:
    rng = np.random.default_rng(4)
    x0, clean = (rng.standard_normal((1, 20, 4)).astype(np.float32) for _ in range(2))
    mask = rng.random((1, 20, 1)).astype(np.float32)
    ref = _t(x0) * _t(mask) + _t(clean).float() * (1 - _t(mask))  # pipelines' post_process_latent
    assert _rel_err(apply_clean(x0, clean, mask), ref) <= 1e-6


def test_keyframe_append_matches_reference() -> None:
    """LatentState.append_tokens lays tokens out as VideoConditionByKeyframeIndex does under 1.1.6's
    latent rule (zeros appended to the noisy latent)."""
    from ltx_core.components.patchifiers import VideoLatentPatchifier
    from ltx_core.conditioning.types import VideoConditionByKeyframeIndex
    from ltx_core.tools import VideoLatentTools

    tools = VideoLatentTools(VideoLatentPatchifier(1), ltx_types.VideoLatentShape(1, 8, 3, 2, 3), fps=24.0)
    ref0 = tools.create_initial_state("cpu", torch.float32)
    kf = torch.randn(1, 8, 1, 2, 3, generator=torch.Generator().manual_seed(5))
    from tests.parity.upstream_rules import conditioned_1_1_6

    ref = conditioned_1_1_6(VideoConditionByKeyframeIndex(kf, frame_idx=16, strength=0.95), ref0, tools)
    ours = LatentState(
        latent=ref0.latent.numpy(),
        denoise_mask=ref0.denoise_mask.numpy(),
        clean_latent=ref0.clean_latent.numpy(),
        positions=ref0.positions.numpy(),
    ).append_tokens(tools.patchifier.patchify(kf).numpy(), ref.positions[:, :, 18:].numpy(), 0.95)
    np.testing.assert_array_equal(ours.latent, ref.latent.numpy())
    np.testing.assert_array_equal(ours.clean_latent, ref.clean_latent.numpy())
    np.testing.assert_allclose(ours.denoise_mask, ref.denoise_mask.numpy(), rtol=0, atol=1e-7)
    np.testing.assert_array_equal(ours.positions, ref.positions.numpy())
