"""The render spec's guidance fields (the dev recipes' knobs): their rules and the one cross-field check.

Part of the contract beside `protos/spec.py`, which merges `GUIDANCE_FIELDS` into its field table and
calls `check_guidance` once a spec is built. None for a knob means the recipe's default (upstream's
`constants.py`, resolved by `coordinator/plan/guidance.py`). Ranges: every scale finite and >= 0
(upstream's guiders treat cfg 1, STG 0 and modality 1 as off; below 0 they point away from the
prompt, which no upstream recipe does), rescale in [0, 1] (a blend of the std-matched prediction and
the raw one), STG blocks distinct whole numbers (whether they lie inside the model is the planner's
check: it knows the pack), steps 1..MAX_STEPS. The distilled recipe runs no guidance pass, so it
refuses every knob, the negative prompt included.
"""

from __future__ import annotations

from protos.fields import SpecError, integer, number, short_repr, text

DISTILLED, ONE_STAGE, TWO_STAGE, TWO_STAGE_HQ = "distilled", "one-stage", "two-stage", "two-stage-hq"
PIPELINES = (DISTILLED, ONE_STAGE, TWO_STAGE, TWO_STAGE_HQ)
MAX_STEPS = 200       # upstream's recipes use 15..40; past this a render is a mistake, not a choice
MAX_SCALE = 100.0
MAX_STG_BLOCKS = 64
MAX_BLOCK = 1023
MAX_NEGATIVE_PROMPT_CHARS = 20_000


def pipeline(name: str, value: object) -> str:
    if value not in PIPELINES:
        raise SpecError(f"{name} {short_repr(value)} is not one of {', '.join(PIPELINES)}")
    return str(value)


def stg_blocks(name: str, value: object) -> tuple[int, ...]:
    """Distinct block indices (a list, or text like "28" / "28,29" as the CLI passes it)."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if not all(p.lstrip("-").isdigit() for p in parts):
            raise SpecError(f"{name} {short_repr(value)} must be block numbers like 28 or 28,29")
        value = [int(p) for p in parts]
    if not isinstance(value, list | tuple) or len(value) > MAX_STG_BLOCKS:
        raise SpecError(f"{name} must be a list of at most {MAX_STG_BLOCKS} block numbers")
    blocks = tuple(integer(0, MAX_BLOCK)(f"{name} entry", v) for v in value)
    if len(set(blocks)) != len(blocks):
        raise SpecError(f"{name} {list(blocks)} names a block twice")
    return blocks


def _scale(name: str, value: object) -> float:
    return number(0.0, MAX_SCALE)(name, value)


GUIDANCE_FIELDS = {
    "pipeline": pipeline,
    "steps": integer(1, MAX_STEPS),
    "stage1_steps": integer(1, MAX_STEPS),
    "stage2_steps": integer(1, MAX_STEPS),  # at most the stage-2 table's steps: the planner's check
    "cfg_scale": _scale,
    "stg_scale": _scale,
    "stg_blocks": stg_blocks,
    "rescale": number(0.0, 1.0),
    "modality_scale": _scale,
    "audio_cfg_scale": _scale,
    "audio_stg_scale": _scale,
    "audio_rescale": number(0.0, 1.0),
    "audio_modality_scale": _scale,
    "negative_prompt": text(MAX_NEGATIVE_PROMPT_CHARS),
}
KNOBS = tuple(k for k in GUIDANCE_FIELDS if k != "pipeline")
FLAG = {k: "--" + k.replace("_", "-") for k in KNOBS}


def check_guidance(spec: object) -> None:
    """Cross-field rule: the distilled recipe (no guidance pass) takes no guidance knob."""
    if getattr(spec, "pipeline", DISTILLED) != DISTILLED:
        return
    given = [k for k in KNOBS if getattr(spec, k, None) is not None]
    if not given:
        return
    what = ("it has no uncond pass to read a negative prompt" if given[0] == "negative_prompt"
            else "it runs no guidance passes and fixed sigma tables")
    raise SpecError(f"{FLAG[given[0]]} does not apply to the distilled pipeline ({what}); "
                    f"pick --pipeline one-stage, two-stage or two-stage-hq")
