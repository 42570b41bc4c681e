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
