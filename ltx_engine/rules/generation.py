"""Which LTX generation a pack holds (2.3 or 2.5), from its metadata and its DiT's weights. Pure.

Upstream decides generation-dependent behaviour (the ancestral stage-1 sampler of the distilled
pipeline, keyframe slots) from the checkpoint's `model_version` metadata (`detect_model_version`,
`should_use_ancestral_sampler`). An MLX pack carries that version in mlx-forge's `config.json` /
`split_model.json`, or in an official file's safetensors metadata; a pack that records none is read
from its DiT: LTX-2.5 is the generation whose transformer has the learned keyframe marker
(`keyframes_abs_pos_embedding`). Workers report the result per pack (`pack_generation`) and the
planner records it in the render's spec, so the coordinator never opens a weight file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

GENERATIONS = ("2.3", "2.5")
LTX_23, LTX_25 = GENERATIONS
ANCESTRAL_SINCE = (2, 5)           # upstream ANCESTRAL_SAMPLER_SINCE_VERSION
KEYFRAME_KEY = "keyframes_abs_pos_embedding"


def parse_version(text: object) -> tuple[int, ...]:
    """`"2.5.0"`, `"2.4-rc2"`, `"v2.3"` → (2, 5, 0), (2, 4), (2, 3); () when there is no number (upstream
    compares () below every version). Parsing stops at the first part that is not a number."""
    parts = re.split(r"[.\-]", str(text or "").strip().lstrip("vV"))
    out: list[int] = []
    for part in parts:
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def detect_generation(versions: Iterable[object], transformer_config: dict, transformer_keys: Iterable[str]) -> str:
    """The generation of a pack: its first recorded `model_version` that parses (>= 2.5 is "2.5",
    older "2.3"), else "2.5" when the DiT carries the keyframe marker (a weight key, or the embedded
    config's `use_keyframes_abs_pos_embedding`), else "2.3"."""
    for text in versions:
        parsed = parse_version(text)
        if parsed:
            return LTX_25 if parsed >= ANCESTRAL_SINCE else LTX_23
    if transformer_config.get("use_keyframes_abs_pos_embedding"):
        return LTX_25
    return LTX_25 if any(KEYFRAME_KEY in key.split(".") for key in transformer_keys) else LTX_23


def check_generation(value: object) -> str:
    """A generation named in a spec or a worker's report, checked."""
    if value not in GENERATIONS:
        raise ValueError(f"unknown LTX generation {value!r} (one of {', '.join(GENERATIONS)})")
    return str(value)


def stage1_sampler(generation: str, dfr: bool = False) -> str:
    """Stage 1's sampler as upstream after 1.2.0 picks it (`should_use_ancestral_sampler`): ancestral Euler
    from LTX-2.5 on, DFR's stage 1 included (1.2.0's DFR kept plain Euler there; `dfr` no longer matters)."""
    from ltx_engine.rules.sampling import EULER, EULER_ANCESTRAL

    del dfr
    return EULER_ANCESTRAL if check_generation(generation) == LTX_25 else EULER


def stage2_sampler(generation: str) -> str:
    """Stage 2's sampler: 1.2.0 sampled it with plain Euler on every generation; upstream after 1.2.0
    (v1.4: `_sampler_kwargs(seed, ANCESTRAL_STAGE_2_NOISE_SEED_OFFSET)`) and the MLX port sample it
    ancestrally (eta 1) on LTX-2.5, re-noise keyed by seed + 20000. The farm follows the newer rule."""
    return stage1_sampler(generation)
