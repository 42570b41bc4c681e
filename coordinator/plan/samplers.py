"""Which sampler each stage task records, from the generation the planner recorded. Pure.

Upstream after 1.2.0 samples every pass of an LTX-2.5 pipeline with ancestral Euler (eta 1), each pass
re-noised from its own seed offset (stage 1: seed + 10000, stage 2: seed + 20000); 1.2.0 did so for the
distilled stage 1 only (tests/parity/upstream_rules.py). With no generation recorded (no worker described
the pack at submit) nothing is written and the worker picks the same rule from its own pack.
"""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.generation import stage2_sampler
from ltx_engine.rules.sampling import ANCESTRAL_STAGE2_NOISE_SEED_OFFSET, EULER

STEP_KEYS = (
    "sampler",
    "seed",
    "ancestral_offset",
)  # what a coordinator step needs to re-noise as a worker does


def stage2_params(spec: RenderPlan, distilled_stage2: bool = True) -> dict:
    """Stage 2's sampler and its re-noise offset; nothing when the generation is not known.
    `distilled_stage2`: the recipe's fact (`plan/recipes/`); a guided two-stage's stage 2 keeps Euler
    (main's guided pipelines were not read for this rule)."""
    if not distilled_stage2:
        return {"sampler": EULER}
    generation = spec.generation
    if not generation:
        return {}
    return {"sampler": stage2_sampler(generation), "ancestral_offset": ANCESTRAL_STAGE2_NOISE_SEED_OFFSET}


def step_params(params: Mapping) -> dict:
    """The sampler keys of a stage's params a tiled `tdp_step` carries (the seed keys its re-noise)."""
    return {k: params[k] for k in STEP_KEYS if k in params}
