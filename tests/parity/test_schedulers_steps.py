"""Schedulers and steps upstream's guided pipelines offer, float32, <= 1e-5 relative.

- `linear_quadratic_sigmas` / `beta_sigmas` == ltx-core 1.0.0's `LinearQuadraticScheduler` /
  `BetaScheduler` (unchanged in 1.2.0), the installed classes themselves;
- res_2s's step with `eta` == 1.2.0's `Res2sDiffusionStep.step` (`upstream_rules.res2s_step_1_2_0`, on
  1.0.0's `get_sde_coeff`), and at eta 0.5 == 1.0.0's step itself;
- `euler_cfg_pp_step` == 1.2.0's `EulerCfgPpDiffusionStep` (`upstream_rules.euler_cfg_pp_step_1_2_0`;
  1.0.0 has no CFG++ step).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")
scipy_stats = pytest.importorskip("scipy.stats")  # upstream's BetaScheduler reads its quantiles

from ltx_core.components.diffusion_steps import Res2sDiffusionStep  # noqa: E402
from ltx_core.components.schedulers import BetaScheduler, LinearQuadraticScheduler  # noqa: E402

from ltx_engine.rules import res2s  # noqa: E402
from ltx_engine.rules.sampling import DISTILLED_SIGMAS, euler_cfg_pp_step  # noqa: E402
from ltx_engine.rules.schedule import BETA_TIMESTEPS, beta_sigmas, linear_quadratic_sigmas, ltx2_sigmas  # noqa: E402
from tests.parity.upstream_rules import euler_cfg_pp_step_1_2_0, res2s_step_1_2_0  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _rel(got, want) -> float:
    w = np.asarray(want, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - w).max() / max(np.abs(w).max(), 1e-12))


@pytest.mark.parametrize("steps,threshold,linear", [(1, 0.025, None), (2, 0.025, None), (8, 0.025, None),
                                                    (30, 0.025, None), (40, 0.05, 10), (25, 0.1, 25)])
def test_linear_quadratic_equals_reference(steps, threshold, linear):
    want = LinearQuadraticScheduler().execute(steps, threshold_noise=threshold, linear_steps=linear).numpy()
    got = linear_quadratic_sigmas(steps, threshold, linear)
    assert len(got) == len(want) and _rel(got, want) <= 1e-5


def _tie(steps: int, a: float, b: float) -> bool:
    """Whether a quantile of this schedule sits on a rounding boundary of the table (x 9999 = k + 0.5,
    e.g. Beta(1, 1)'s exact rationals): there both sides' pick is float noise, one entry either way."""
    q = 1 - np.linspace(0, 1, steps, endpoint=False)
    if a == b:  # the symmetric median is 0.5 exactly on both sides (engine: by symmetry), not a tie
        q = q[q != 0.5]
    v = scipy_stats.beta.ppf(q, a, b) * (BETA_TIMESTEPS - 1)
    return bool(np.min(np.abs(v - np.floor(v) - 0.5)) < 1e-9)


@pytest.mark.parametrize("a,b", [(0.6, 0.6), (0.5, 0.7), (2.0, 3.0), (0.3, 0.3), (3.0, 0.8), (1.0, 1.0)])
def test_beta_equals_reference(a, b):
    checked = 0
    for steps in range(1, 121):
        if _tie(steps, a, b):
            continue
        want = BetaScheduler().execute(steps, a, b).numpy()
        got = beta_sigmas(steps, a, b)
        assert len(got) == len(want) and _rel(got, want) <= 1e-5, steps
        checked += 1
    assert checked >= 80
    assert beta_sigmas(40, a, b) != ltx2_sigmas(40)  # another schedule


def test_bad_schedule_parameters_are_refused():
    with pytest.raises(ValueError, match="alpha"):
        beta_sigmas(10, 0.0, 0.6)
    with pytest.raises(ValueError, match="threshold"):
        linear_quadratic_sigmas(10, threshold_noise=1.5)
    with pytest.raises(ValueError, match="eta"):
        res2s.sde_coefficients(0.5, eta=1.5)
    with pytest.raises(ValueError, match="eta"):
        euler_cfg_pp_step(np.zeros(2), np.zeros(2), np.zeros(2), 0.5, 0.4, eta=-0.1)


@pytest.mark.parametrize("eta", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_res2s_step_with_eta_equals_1_2_0(eta):
    rng = np.random.default_rng(4)
    x, x0, n = (rng.standard_normal((1, 24, 8)) for _ in range(3))
    sigmas = torch.tensor([0.9, 0.7, 0.35, 0.0011], dtype=torch.float32)
    for step in range(3):
        want = res2s_step_1_2_0(*(torch.from_numpy(a) for a in (x, x0)), sigmas, step, torch.from_numpy(n), eta)
        got = res2s.sde_step(x, x0, sigmas[step].item(), sigmas[step + 1].item(), n, eta=eta)
        assert _rel(got, want.numpy()) <= 1e-5
        if eta == 0.5:  # 1.0.0's own step, its eta fixed at 0.5
            old = Res2sDiffusionStep().step(torch.from_numpy(x), torch.from_numpy(x0), sigmas, step, torch.from_numpy(n))
            assert _rel(got, old.numpy()) <= 1e-5
        elif eta > 0:
            assert _rel(got, res2s.sde_step(x, x0, sigmas[step].item(), sigmas[step + 1].item(), n)) > 1e-4


def test_res2s_finish_passes_eta_to_the_step_only():
    rng = np.random.default_rng(5)
    x, x0_1, x0_2, n1, n2 = (rng.standard_normal((1, 12, 4)) for _ in range(5))
    mask, clean = np.ones((1, 12, 1), np.float32), np.zeros((1, 12, 4), np.float32)
    sig = res2s.res2s_sigmas((0.9, 0.6, 0.0))
    mid = res2s.res2s_midpoint(x, x0_1, mask, clean, sig, 0, n1)
    h, sub = mid.h, mid.sub_sigma
    _, b1, b2 = res2s.coefficients(h)
    combo = mid.anchor + h * (b1 * mid.eps1 + b2 * (x0_2.astype(np.float32).astype(np.float64) - mid.anchor))
    for eta in (0.0, 0.8):
        want = res2s_step_1_2_0(torch.from_numpy(mid.anchor), torch.from_numpy(combo),
                                torch.tensor(sig, dtype=torch.float32), 0, torch.from_numpy(n2), eta)
        got = res2s.res2s_finish(mid, x0_2, mask, clean, sig, 0, n2, eta=eta)
        assert _rel(got, want.numpy()) <= 1e-5
    assert sub == pytest.approx(float(np.sqrt(np.float64(np.float32(0.9)) * np.float64(np.float32(0.6)))))


@pytest.mark.parametrize("eta,s_noise", [(0.0, 1.0), (0.5, 1.0), (1.0, 1.0), (1.0, 0.5)])
def test_euler_cfg_pp_step_equals_1_2_0(eta, s_noise):
    rng = np.random.default_rng(6)
    x, cond, uncond, n = (rng.standard_normal((1, 30, 8)).astype(np.float32) for _ in range(4))
    sigmas = torch.tensor(DISTILLED_SIGMAS, dtype=torch.float32)
    for step in range(len(DISTILLED_SIGMAS) - 1):  # from sigma 1 (alpha clamped) to the last step to 0
        want = euler_cfg_pp_step_1_2_0(*(torch.from_numpy(a) for a in (x, cond, uncond)), sigmas, step, eta,
                                       torch.from_numpy(n), s_noise)
        got = euler_cfg_pp_step(x, cond, uncond, DISTILLED_SIGMAS[step], DISTILLED_SIGMAS[step + 1], eta, n, s_noise)
        assert np.isfinite(got).all() and _rel(got, want.numpy()) <= 1e-5, step
