"""A guided recipe's refusals beyond its scales (issue #23): stage-2 steps, and what is not built. Pure.

Each is one line at submit (exit 2 through the CLI, nothing queued), checked once the recipe resolved
(`plan/guidance.check_recipe`): `--stage2-steps` takes the last N steps of the stage-2 table as the MLX
port does, so it is at most the table's steps and never beside an explicit `--stage2-sigmas`; two-stage
HQ's res_2s stage 2 is planned untiled only; run-time (unfused) LoRA adapters attach to a resident
distilled DiT only, not to the dev DiT the guided passes and stage 2 load.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from coordinator.plan.graph import SpecError
from coordinator.plan.guidance import recipe
from coordinator.plan.stage2 import stage2_sigmas
from protos.guidance_spec import ONE_STAGE, TWO_STAGE_HQ


def check_guided_extras(spec: Mapping) -> None:
    """Refuse what a guided render cannot run, in one line."""
    pipeline = spec["pipeline"]
    n = spec.get("stage2_steps")
    if n is not None:
        if pipeline == ONE_STAGE:
            raise SpecError("--stage2-steps is a stage-2 option; --pipeline one-stage has no stage 2")
        if spec.get("stage2_sigmas") is not None:
            raise SpecError("--stage2-steps and --stage2-sigmas both set stage 2's schedule: give one")
        table = len(stage2_sigmas({**spec, "stage2_steps": None})) - 1
        if int(n) > table:
            raise SpecError(f"--stage2-steps {n}: stage 2's sigma table has {table} steps (1..{table})")
    sigmas = recipe(spec).sigmas
    if not all(math.isfinite(x) for x in sigmas):  # upstream's LTX2Scheduler gives NaN there too
        raise SpecError(
            f"--steps {len(sigmas) - 1}: the LTX2 schedule on {pipeline}'s stage-1 latent is not finite "
            "at that count (its stretch divides by zero): use --steps 2 or more"
        )
    if pipeline == TWO_STAGE_HQ and spec.get("stage2_tiles") is not None:
        raise SpecError(
            "--stage2-tiles is not built for --pipeline two-stage-hq (its res_2s stage 2 runs untiled)"
        )
    if spec.get("loras") and str(spec.get("lora_mode") or "fused") != "fused":
        raise SpecError(
            f"--lora-mode {spec['lora_mode']} is not built for --pipeline {pipeline} "
            "(its dev DiT takes fused LoRAs): use --lora-mode fused"
        )
