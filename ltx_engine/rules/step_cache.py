"""Step caching (TeaCache, as the MLX port ltx-2-mlx runs it): when to skip a forward's block stack.

A DiT forward's block stack changes its input by a residual that drifts slowly between sampler steps.
The rule watches the first block's modulated video input (`rms(x) * (1 + scale_sa) + shift_sa`, the
"gate" signal: cheap, it needs only the patchify projection and the AdaLN), measures its relative L1
change since the previous step, rescales that through a polynomial fitted on the port's calibration
runs, and accumulates it; while the sum stays under the threshold the step reuses the residual of the
last computed step instead of running the blocks. The first and last steps always compute.

Pure (numpy only): the decision is a function of the data alone (the gate of this step and the
previous one, the accumulated distance, the step index), never of process history or timing, so a
pass or tile continued on another worker decides the same. The coordinator checks specs with it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The port's LTX-2 stage-1 fit (dev model, 30 Euler steps; `ti2vid_two_stages.py`), highest degree
# first as numpy's polyval reads it: y = 1.364 x + 0.409. Its constant term means every step adds at
# least 0.409, so a threshold below that never skips.
COEFFICIENTS: tuple[float, ...] = (1.3641334114092996, 0.40915524073366694)
PORT_THRESHOLD = 0.5  # the port's conservative default (~1.46x on a 30-step two-stage render)


def check_threshold(value: float) -> float:
    """The threshold as a float; a negative or non-finite one refused in one line (the spec's rule)."""
    thresh = float(value)
    if not math.isfinite(thresh) or thresh < 0:
        raise ValueError(f"step-cache threshold {value!r} must be a finite number >= 0")
    return thresh


def relative_l1(current: np.ndarray, previous: np.ndarray) -> float:
    """mean|current - previous| / mean|previous|, reduced in float32 (the port's calibration rule)."""
    cur = np.asarray(current, np.float32)
    prev = np.asarray(previous, np.float32)
    base = float(np.mean(np.abs(prev)))
    diff = float(np.mean(np.abs(cur - prev)))
    return math.inf if base == 0.0 else diff / base


def rescale(distance: float, coefficients: tuple[float, ...] = COEFFICIENTS) -> float:
    """The polynomial that maps the gate's change to the block residual's expected change."""
    return float(np.polyval(np.asarray(coefficients, np.float64), distance))


@dataclass(frozen=True)
class Decision:
    """One step's verdict: run the blocks (`compute`) or reuse the residual; the sum carried on."""

    compute: bool
    accumulated: float


def decide(step: int, steps: int, distance: float | None, accumulated: float, threshold: float) -> Decision:
    """TeaCache's rule at step `step` of `steps`: the first and last steps (and a step with no previous
    gate, `distance` None) compute and reset the sum; otherwise the rescaled distance is added and the
    step skips while the sum stays under `threshold`, computing (and resetting) once it reaches it."""
    if step <= 0 or step >= steps - 1 or distance is None:
        return Decision(True, 0.0)
    total = accumulated + rescale(distance)
    if total < threshold:
        return Decision(False, total)
    return Decision(True, 0.0)


# What the cost model assumes a step adds to the sum: the port's measured skip rates (about 55 % of the
# interior steps at 1.0, 69 % at 1.5, a fifth at 0.5) fit a step of about 0.6 (its mean output drift 0.56).
TYPICAL_STEP = 0.6
PARAM, STEP_PARAM, STEPS_PARAM = "step_cache", "cache_step", "cache_steps"  # task params
NAMES = ("gate", "residual", "audio_residual", "sum")  # a chain's state: inputs and outputs cache_<name>


def interior_fraction(threshold: float) -> float:
    """The share of interior steps expected to run their blocks: one in every ceil(threshold / step)."""
    return 1.0 / max(1, math.ceil(threshold / TYPICAL_STEP - 1e-9))


def expected_forwards(threshold: float | None, steps: int, step: int | None = None) -> float:
    """Forwards expected to run their block stack: of a stage's `steps` (first and last always), or of
    the one forward at `step` of them; without a threshold, every one."""
    if threshold is None:
        return float(steps if step is None else 1)
    if step is not None:
        return 1.0 if step <= 0 or step >= steps - 1 else interior_fraction(threshold)
    return float(min(steps, 2)) + max(0, steps - 2) * interior_fraction(threshold)
