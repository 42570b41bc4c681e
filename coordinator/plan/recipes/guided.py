"""The guided recipes' shared rules (one-stage, two-stage, two-stage HQ). Pure.

Why shared: the three run the same guided stage on the dev DiT (`plan/guidance.py`), so the rules of
their scales and stage-2 schedule are one function the three recipe modules point at. Which flags
each takes at all is the modifier table's (`recipes/modifiers.py`).
"""

from __future__ import annotations

import math

from coordinator.plan.graph import SpecError
from coordinator.plan.guidance import GuidedRule, check_recipe
from coordinator.plan.recipes.base import Check, PackFacts
from coordinator.plan.resolved import RenderPlan
from coordinator.plan.stage2 import stage2_sigmas

# The two-stage guided recipes' own flags and what their default render loads (one-stage: no stage 2).
TWO_STAGE_FIELDS = ("steps", "stage1_steps", "stage2_steps", "cfg_scale", "stg_scale", "stg_blocks", "rescale",
                    "modality_scale", "negative_prompt")
TWO_STAGE_COMPONENTS = ("text_encoder", "connector", "transformer_dev", "distilled_lora", "spatial_upscaler",
                        "vae_decoder", "audio_vae", "vocoder")
TWO_STAGE_DITS = ("transformer_dev", "distilled_lora", "spatial_upscaler")


def guided_check(rule: GuidedRule) -> Check:
    """A guided recipe's check: its rule's scales against the reference DiT, stage 2's steps, a finite
    stage-1 schedule."""

    def check(spec: RenderPlan, pack: PackFacts) -> dict | None:
        return _check_guided(spec, rule)

    return check


def _check_guided(spec: RenderPlan, rule: GuidedRule) -> None:
    rec = check_recipe(spec, rule)
    n = spec.stage2_steps
    if n is not None:
        if spec.stage2_sigmas is not None:
            raise SpecError("--stage2-steps and --stage2-sigmas both set stage 2's schedule: give one")
        table = len(stage2_sigmas(spec.with_asked(stage2_steps=None))) - 1
        if int(n) > table:
            raise SpecError(f"--stage2-steps {n}: stage 2's sigma table has {table} steps (1..{table})")
    if not all(math.isfinite(x) for x in rec.sigmas):  # upstream's LTX2Scheduler gives NaN there too
        raise SpecError(
            f"--steps {len(rec.sigmas) - 1}: the LTX2 schedule on {rec.pipeline}'s stage-1 latent is not finite "
            "at that count (its stretch divides by zero): use --steps 2 or more"
        )
    return None
