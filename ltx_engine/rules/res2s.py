"""The res_2s second-order sampler (the HQ recipe), pure numpy.

ltx-core's `Res2sDiffusionStep` and ltx-pipelines' `res2s_audio_video_denoising_loop` /
`utils/res2s.get_res2s_coefficients` (legacy mode, bongmath on), split at the two model evaluations
of a step so the farm can run each evaluation's guidance passes as tasks:

1. `res2s_midpoint`: from the step's latent x and the first evaluation's x0 (at sigma), the RK
   midpoint at `sub_sigma = sqrt(sigma * sigma_next)`, with SDE noise, then the anchor refined by
   100 bong iterations when `h < 0.5 and sigma > 0.03`.
2. `res2s_finish`: from the midpoint and the second evaluation's x0 (at sub_sigma), the step's
   combination `anchor + h (b1 eps1 + b2 eps2)` with step-level SDE noise.

A schedule ending at 0 gets a last sigma 0.0011 inserted (`res2s_sigmas`); after the full steps one
more evaluation at 0.0011 gives the final x0. The state math runs in float64, as upstream's; the
latent the model reads is cast back to the model dtype (float32 here). The step-level SDE
coefficients come from float32 sigmas, the substep ones from float64, as upstream's tensors are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

F32, F64 = np.float32, np.float64
C2 = 0.5
ETA = 0.5  # the step-level SDE share, sigma_up = eta x sigma_next; substeps keep 0.5 (upstream's loop)
FINAL_SIGMA = 0.0011
SUBSTEP_SEED_OFFSET = 10000
BONG_ITERATIONS = 100
# Noise streams (distinct from sampling.STREAM_*): SDE noise per modality, step and substep.
STREAM_VIDEO_STEP, STREAM_AUDIO_STEP, STREAM_VIDEO_SUBSTEP, STREAM_AUDIO_SUBSTEP = 8, 9, 10, 11


def res2s_sigmas(sigmas: tuple[float, ...] | list[float]) -> tuple[float, ...]:
    """The loop's schedule: a final 0 becomes (0.0011, 0), values kept float32."""
    s = [float(F32(x)) for x in sigmas]
    if s[-1] == 0:
        s = s[:-1] + [float(F32(FINAL_SIGMA)), 0.0]
    return tuple(s)


def full_steps(sigmas: tuple[float, ...] | list[float]) -> int:
    """Two-evaluation steps of a schedule as given (before `res2s_sigmas`)."""
    return len(sigmas) - 1


def evaluations(sigmas: tuple[float, ...] | list[float]) -> int:
    """Model evaluations the loop runs: two per full step, one more when the schedule ends at 0."""
    return 2 * full_steps(sigmas) + (1 if float(sigmas[-1]) == 0 else 0)


def phi(j: int, neg_h: float) -> float:
    """phi_j(z) = (e^z - sum_{k<j} z^k/k!) / z^j; 1/j! near 0."""
    if abs(neg_h) < 1e-10:
        return 1.0 / math.factorial(j)
    remainder = sum(neg_h**k / math.factorial(k) for k in range(j))
    return (math.exp(neg_h) - remainder) / neg_h**j


def coefficients(h: float, c2: float = C2) -> tuple[float, float, float]:
    """(a21, b1, b2): a21 = c2 phi1(-h c2), b2 = phi2(-h) / c2, b1 = phi1(-h) - b2."""
    a21 = c2 * phi(1, -h * c2)
    b2 = phi(2, -h) / c2
    return a21, phi(1, -h) - b2, b2


def step_size(sigmas: tuple[float, ...], step: int) -> float:
    """h = -log(sigma_next / sigma) in float64 of the float32 sigmas."""
    return float(-np.log(F64(F32(sigmas[step + 1])) / F64(F32(sigmas[step]))))


def sde_coefficients(sigma_next, dtype=F32, eta: float = ETA) -> tuple:
    """`get_sde_coeff(sigma_next, sigma_up=sigma_next * eta)` -> (alpha_ratio, sigma_down, sigma_up)."""
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"res_2s eta {eta} must be in [0, 1]")
    sn = dtype(sigma_next)
    up = min(sn * dtype(eta), sn * dtype(0.9999))
    residual = dtype(np.sqrt(max(sn * sn - up * up, dtype(0))))
    alpha = (dtype(1) - sn) + residual
    down = residual / alpha
    if np.isnan(down):
        down = sn
    return dtype(alpha), dtype(down), dtype(up)


def sde_step(sample: np.ndarray, denoised: np.ndarray, sigma, sigma_next, noise: np.ndarray, dtype=F32,
             eta: float = ETA) -> np.ndarray:
    """`Res2sDiffusionStep.step` from sigma to sigma_next (coefficients in `dtype`), float64 arrays;
    eta 0 returns the deterministic `denoised` (upstream: sigma_up 0)."""
    alpha, down, up = sde_coefficients(sigma_next, dtype, eta)
    if up == 0 or dtype(sigma_next) == 0:
        return np.asarray(denoised, F64)
    eps = (sample - denoised) / (dtype(sigma) - dtype(sigma_next))
    denoised_next = sample - dtype(sigma) * eps
    return alpha * (denoised_next + down * eps) + up * np.asarray(noise, F64)


def sde_noise(shape: tuple[int, ...], seed: int, stream: int) -> np.ndarray:
    """Float64 Philox normal noise, standardised over the whole array then per sample over the last two axes."""
    key = np.array([seed % (1 << 64), stream % (1 << 64)], dtype=np.uint64)
    raw = np.random.Generator(np.random.Philox(key=key)).standard_normal(size=tuple(shape), dtype=F64)
    return normalise_noise(raw)


def normalise_noise(raw: np.ndarray) -> np.ndarray:
    """Upstream's `_get_new_noise` normalisation (unbiased std), float64."""
    n = np.asarray(raw, F64)
    n = (n - n.mean()) / n.std(ddof=1)
    return (n - n.mean(axis=(-2, -1), keepdims=True)) / n.std(axis=(-2, -1), ddof=1, keepdims=True)


def post_process(x: np.ndarray, mask: np.ndarray, clean: np.ndarray) -> np.ndarray:
    """`post_process_latent` on a float64 state: x*mask + clean*(1-mask), the clean part in float32."""
    m = np.asarray(mask, F32)
    return np.asarray(x, F64) * m + (np.asarray(clean, F32) * (F32(1) - m))


@dataclass(frozen=True)
class Midpoint:
    """What the second evaluation of a res_2s step needs, and what `res2s_finish` reads back."""

    x_mid: np.ndarray     # float64; the model reads x_mid.astype(float32) at sub_sigma
    anchor: np.ndarray    # float64, after bong refinement
    eps1: np.ndarray      # float64
    sub_sigma: float
    h: float


def res2s_midpoint(x: np.ndarray, x0_1: np.ndarray, mask: np.ndarray, clean: np.ndarray,
                   sigmas: tuple[float, ...], step: int, noise: np.ndarray, bongmath: bool = True) -> Midpoint:
    """Stage 1 of step `step` on the `res2s_sigmas` schedule; x0_1 is the first evaluation's guided x0."""
    d1 = np.asarray(x0_1, F32) * np.asarray(mask, F32) + np.asarray(clean, F32) * (F32(1) - np.asarray(mask, F32))
    d1 = d1.astype(F64)
    sigma, sigma_next = F64(F32(sigmas[step])), F64(F32(sigmas[step + 1]))
    h = step_size(sigmas, step)
    a21, _, _ = coefficients(h)
    sub_sigma = float(np.sqrt(sigma * sigma_next))
    anchor = np.asarray(x, F64)
    eps1 = d1 - anchor
    x_mid = anchor + h * a21 * eps1
    x_mid = post_process(sde_step(anchor, x_mid, sigma, sub_sigma, noise, dtype=F64), mask, clean)
    if bongmath and h < 0.5 and sigma > 0.03:
        for _ in range(BONG_ITERATIONS):
            anchor = x_mid - h * a21 * eps1
            eps1 = d1 - anchor
    return Midpoint(x_mid=x_mid, anchor=anchor, eps1=eps1, sub_sigma=sub_sigma, h=h)


def res2s_finish(mid: Midpoint, x0_2: np.ndarray, mask: np.ndarray, clean: np.ndarray,
                 sigmas: tuple[float, ...], step: int, noise: np.ndarray, eta: float = ETA) -> np.ndarray:
    """Stage 2 of step `step`: the next latent in float32 (the model dtype); `eta` the step's SDE share
    (upstream 1.2.0's `eta`, 0.5 before; the midpoint's substep noise stays at 0.5)."""
    m = np.asarray(mask, F32)
    d2 = (np.asarray(x0_2, F32) * m + np.asarray(clean, F32) * (F32(1) - m)).astype(F64)
    _, b1, b2 = coefficients(mid.h)
    eps2 = d2 - mid.anchor
    x_next = mid.anchor + mid.h * (b1 * mid.eps1 + b2 * eps2)
    x_next = sde_step(mid.anchor, x_next, F32(sigmas[step]), F32(sigmas[step + 1]), noise, dtype=F32, eta=eta)
    return post_process(x_next, mask, clean).astype(F32)
