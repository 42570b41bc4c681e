"""The LTX2 scheduler's sigma schedule (dev stage 1 and one-stage), pure numpy float32.

ltx-core's `LTX2Scheduler.execute`: `steps + 1` evenly spaced sigmas from 1 to 0, shifted by a
token-dependent logistic `e^s / (e^s + (1/sigma - 1))` with `s` linear in the token count between
(1024 tokens, base_shift 0.95) and (4096 tokens, max_shift 2.05), then stretched so the last non-zero
sigma equals `terminal` (0.1). The pipelines call it without a latent, so the token count is the
4096 anchor whatever the resolution (passing the real count over-shifts the schedule).
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32
BASE_SHIFT_ANCHOR = 1024
MAX_SHIFT_ANCHOR = 4096
MAX_STEPS = 1000  # a bound on what a spec may ask for; upstream has none


def ltx2_sigmas(steps: int, tokens: int = MAX_SHIFT_ANCHOR, max_shift: float = 2.05, base_shift: float = 0.95,
                stretch: bool = True, terminal: float = 0.1) -> tuple[float, ...]:
    """The schedule as `steps + 1` float32 values, 1.0 first and 0.0 last."""
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be 1..{MAX_STEPS}, got {steps}")
    sigmas = np.linspace(1.0, 0.0, steps + 1, dtype=F32)
    mm = (max_shift - base_shift) / (MAX_SHIFT_ANCHOR - BASE_SHIFT_ANCHOR)
    shift = tokens * mm + (base_shift - mm * BASE_SHIFT_ANCHOR)
    e = F32(math.exp(shift))
    nz = sigmas != 0
    out = np.zeros_like(sigmas)
    # torch evaluates `scalar / tensor` as `reciprocal(tensor) * scalar`: mirrored, so at sigma 1 the
    # shifted value sits one rounding below 1 and a 1-step schedule stretches to 0.1 as upstream's does.
    out[nz] = (F32(1.0) / (e + (F32(1.0) / sigmas[nz] - F32(1.0)))) * e
    if stretch:  # 1 step on a latent whose shift rounds sigma 1 to 1: 0/0, NaN as upstream (the planner refuses it)
        one_minus = F32(1.0) - out[nz]
        scale = one_minus[-1] / F32(1.0 - terminal)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[nz] = F32(1.0) - one_minus / scale
    return tuple(float(s) for s in out.astype(F32))


def linear_quadratic_sigmas(steps: int, threshold_noise: float = 0.025,
                            linear_steps: int | None = None) -> tuple[float, ...]:
    """ltx-core's `LinearQuadraticScheduler`: 1 - t with t rising linearly to `threshold_noise` over
    `linear_steps` (half the steps by default), then on a quadratic to 1; `steps + 1` float32 values."""
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be 1..{MAX_STEPS}, got {steps}")
    if steps == 1:
        return (1.0, 0.0)
    linear = steps // 2 if linear_steps is None else linear_steps
    if not 0 < linear <= steps or not 0.0 < threshold_noise < 1.0:
        raise ValueError(f"linear steps {linear} must be 1..{steps}, threshold noise {threshold_noise} in (0, 1)")
    ts = [i * threshold_noise / linear for i in range(linear)]
    quadratic = steps - linear
    if quadratic > 0:
        diff = linear - threshold_noise * steps
        q_coef = diff / (linear * quadratic**2)
        l_coef = threshold_noise / linear - 2 * diff / quadratic**2
        const = q_coef * linear**2
        ts += [q_coef * i**2 + l_coef * i + const for i in range(linear, steps)]
    return tuple(float(F32(1.0 - t)) for t in [*ts, 1.0])


BETA_SHIFT = 2.37          # `BetaScheduler.shift`: the flux time shift of its timestep table
BETA_TIMESTEPS = 10000     # `BetaScheduler.timesteps_length`


def beta_sigmas(steps: int, alpha: float = 0.6, beta: float = 0.6) -> tuple[float, ...]:
    """ltx-core's `BetaScheduler` (arXiv 2407.12173): timesteps at the Beta(alpha, beta) quantiles of
    1 - k/steps, rounded onto a 10000-entry flux-shifted table, duplicates dropped, then 0. So it may
    return fewer than `steps + 1` values, as upstream warns."""
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps must be 1..{MAX_STEPS}, got {steps}")
    if not (0.0 < alpha <= 100.0 and 0.0 < beta <= 100.0):
        raise ValueError(f"beta scheduler alpha {alpha} and beta {beta} must be in (0, 100]")
    table = _flux_shift_table()
    last = len(table) - 1
    picked: dict[int, None] = {}
    for q in 1.0 - np.linspace(0.0, 1.0, steps, endpoint=False):
        picked.setdefault(int(np.rint(beta_quantile(float(q), alpha, beta) * last)))
    return (*(float(table[i]) for i in picked), 0.0)


def _flux_shift_table() -> np.ndarray:
    """e^shift / (e^shift + (1/t - 1)) at t = k / 10000, k = 1..10000, in float32 as torch evaluates it
    (`scalar / tensor` as reciprocal times the scalar, the scalar rounded to float32)."""
    t = np.arange(1, BETA_TIMESTEPS + 1, dtype=F32) / F32(BETA_TIMESTEPS)
    e = F32(math.exp(BETA_SHIFT))
    return ((F32(1.0) / (e + (F32(1.0) / t - F32(1.0)))) * e).astype(F32)


def beta_quantile(q: float, a: float, b: float) -> float:
    """The Beta(a, b) quantile (scipy's `beta.ppf`) by bisection on the regularised incomplete beta,
    to float64 resolution: the scheduler rounds it onto 10000 entries, so it must be exact there."""
    if q <= 0.0 or q >= 1.0:
        return min(max(q, 0.0), 1.0)
    if a == b and q == 0.5:  # the symmetric median, exactly: 0.5 x 9999 is a rounding tie
        return 0.5
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if _beta_cdf(mid, a, b) < q else (lo, mid)
    return 0.5 * (lo + hi)


def _beta_cdf(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularised incomplete beta, by its continued fraction (modified Lentz)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(1.0 - x, b, a) / b


def _beta_fraction(x: float, a: float, b: float) -> float:
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    out = d
    for m in range(1, 1000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            out *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return out
