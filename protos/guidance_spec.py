"""The render spec's guidance fields (the dev recipes' knobs): their rules.

Part of the contract beside `protos/spec.py`, which merges `GUIDANCE_FIELDS` into its field table. None for a knob means the recipe's default (upstream's
`constants.py`, resolved by `coordinator/plan/guidance.py`). Ranges: every scale finite and >= 0
(upstream's guiders treat cfg 1, STG 0 and modality 1 as off; below 0 they point away from the
prompt, which no upstream recipe does), rescale in [0, 1] (a blend of the std-matched prediction and
the raw one), STG blocks distinct whole numbers (whether they lie inside the model is the planner's
check: it knows the pack; modality blocks alike), steps 1..MAX_STEPS, a skip step 0 (guide every step) ..MAX_STEPS. Which recipes
take the knobs is the planner's modifier table (`coordinator/plan/recipes/modifiers.py`): the distilled
ones run no guidance pass, so they refuse every knob, the negative prompt included.
"""

from __future__ import annotations

from protos.fields import SpecError, integer, number, short_repr, text

DISTILLED, ONE_STAGE, TWO_STAGE, TWO_STAGE_HQ = "distilled", "one-stage", "two-stage", "two-stage-hq"
T2A = "t2a"  # upstream's t2a_one_stage: the audio track alone
PIPELINES = (DISTILLED, ONE_STAGE, TWO_STAGE, TWO_STAGE_HQ, T2A)
MAX_STEPS = 200       # upstream's recipes use 15..40; past this a render is a mistake, not a choice
MAX_SCALE = 100.0
MAX_STG_BLOCKS = 64
MAX_BLOCK = 1023
MAX_NEGATIVE_PROMPT_CHARS = 20_000
MAX_APG_ETA = 10.0      # eta weights the CFG delta's part along cond: 0 drops it, 1 keeps it, above amplifies
MAX_APG_NORM = 1e6


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


# --guidance-schedule: ltx-core's `MultiModalGuiderFactory.from_dict` (sigma upper bound -> guider params) as
# bins of overrides on the render's resolved guidance, e.g. "1.0:cfg_scale=4;0.5:cfg_scale=2,audio_cfg_scale=5".
SCHEDULE_KEYS = ("cfg_scale", "stg_scale", "rescale", "modality_scale", "skip_step", "audio_cfg_scale",
                 "audio_stg_scale", "audio_rescale", "audio_modality_scale", "audio_skip_step")
MAX_BINS = 16
Schedule = tuple[tuple[float, tuple[tuple[str, float | int], ...]], ...]


def _schedule_text(name: str, value: str) -> list:
    """ "SIGMA:key=value,...;SIGMA:..." -> [[sigma, [[key, value], ...]], ...] (numbers as floats)."""
    bins = []
    for part in (p.strip() for p in value.split(";") if p.strip()):
        bound, sep, rest = part.partition(":")
        pairs = [kv.split("=", 1) for kv in rest.split(",") if kv.strip()]
        try:
            bins.append([float(bound), [[k.strip(), float(v)] for k, v in pairs]])
        except ValueError:
            raise SpecError(f"{name} {short_repr(part)} must read SIGMA:key=value,... (e.g. 0.5:cfg_scale=2)") from None
        if not sep or any(len(kv) != 2 for kv in pairs):
            raise SpecError(f"{name} {short_repr(part)} must read SIGMA:key=value,... (e.g. 0.5:cfg_scale=2)")
    return bins


def guidance_schedule(name: str, value: object) -> Schedule:
    """Bins (sigma upper bound in [0, 1], distinct; overrides of the knobs in SCHEDULE_KEYS, each held to
    that knob's own rule), as text or as the stored lists."""
    bins = _schedule_text(name, value) if isinstance(value, str) else value
    if not isinstance(bins, list | tuple) or not 0 < len(bins) <= MAX_BINS:
        raise SpecError(f"{name} must be 1 to {MAX_BINS} bins SIGMA:key=value,... separated by ';'")
    out = []
    for item in bins:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise SpecError(f"{name} bin {short_repr(item)} must be [sigma, overrides]")
        bound, pairs = number(0.0, 1.0)(f"{name} sigma", item[0]), item[1]
        pairs = list(pairs.items()) if isinstance(pairs, dict) else pairs
        if not isinstance(pairs, list | tuple) or not all(isinstance(kv, list | tuple) and len(kv) == 2 for kv in pairs):
            raise SpecError(f"{name} bin {bound}: its overrides must be key=value pairs")
        keys = [k for k, _ in pairs]
        unknown = [k for k in keys if k not in SCHEDULE_KEYS]
        if unknown or len(set(keys)) != len(keys):
            raise SpecError(f"{name} bin {bound}: {short_repr(unknown or keys)} — give each of "
                            f"{', '.join(SCHEDULE_KEYS)} at most once")
        out.append((bound, tuple((k, GUIDANCE_FIELDS[k](f"{name} {k}", v)) for k, v in pairs)))
    if len({b for b, _ in out}) != len(out):
        raise SpecError(f"{name} names a sigma bound twice")
    return tuple(out)


GUIDANCE_FIELDS = {
    "pipeline": pipeline,
    "steps": integer(1, MAX_STEPS),
    "stage1_steps": integer(1, MAX_STEPS),
    "stage2_steps": integer(1, MAX_STEPS),  # at most the stage-2 table's steps: the planner's check
    "cfg_scale": _scale,
    "stg_scale": _scale,
    "stg_blocks": stg_blocks,
    "modality_blocks": stg_blocks,  # the same rule: distinct block numbers, the pack's depth the planner's
    "rescale": number(0.0, 1.0),
    "modality_scale": _scale,
    "audio_cfg_scale": _scale,
    "audio_stg_scale": _scale,
    "audio_rescale": number(0.0, 1.0),
    "audio_modality_scale": _scale,
    "negative_prompt": text(MAX_NEGATIVE_PROMPT_CHARS),
    "skip_step": integer(0, MAX_STEPS),
    "audio_skip_step": integer(0, MAX_STEPS),
    "apg_eta": number(0.0, MAX_APG_ETA),
    "apg_norm_threshold": number(0.0, MAX_APG_NORM),
    "guidance_schedule": guidance_schedule,
}
KNOBS = tuple(k for k in GUIDANCE_FIELDS if k != "pipeline")

