"""Per-render forward settings in the plan: which tasks carry the sparse taus, the compute dtype
and the step cache (with the chain a pass or tile hands its cache along), and the refusals a spec gets at submit (one line each). Pure."""

from __future__ import annotations

from coordinator.plan.dfr import canvas_frames
from coordinator.plan.graph import SPATIAL_FACTOR, SpecError, latent_frames, ref
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules import step_cache as cache_rule
from ltx_engine.rules import tdp
from ltx_engine.rules.forward_rules import COMPUTE_DTYPES, DEFAULT_COMPUTE_DTYPE, SPARSE_MIN_TOKENS


def step_cache(spec: RenderPlan) -> float | None:
    """The render's step-cache threshold (ltx_engine/rules/step_cache.py), None when it caches nothing."""
    value = spec.step_cache
    return None if value is None else float(value)


def _dtype(spec: RenderPlan) -> dict:
    value, cache = spec.compute_dtype, step_cache(spec)
    return ({"compute_dtype": value} if value and value != DEFAULT_COMPUTE_DTYPE else {}) | (
        {} if cache is None else {cache_rule.PARAM: cache})


def stage1_params(spec: RenderPlan) -> dict:
    """Stage 1 runs the compute dtype and the step cache; its attention stays dense."""
    return _dtype(spec)


def stage2_params(spec: RenderPlan) -> dict:
    """Stage 2 carries the taus (a tiled stage 2 gives each step's forwards their own, `stage2.py`), the
    compute dtype and the step cache."""
    taus = spec.sparse_attention
    return _dtype(spec) | ({"sparse_attention": [float(t) for t in taus]} if taus else {})


def stage2_forward_tokens(spec: RenderPlan) -> int:
    """Generated video tokens of the smallest stage-2 forward (a tile's, when tiled)."""
    grid = (latent_frames(canvas_frames(spec)), spec.height // SPATIAL_FACTOR, spec.width // SPATIAL_FACTOR)
    tiles = spec.stage2_tiles
    if tiles in (None, "1x1", "1x1x1"):
        return grid[0] * grid[1] * grid[2]
    counts = tdp.parse_tile_counts(str(tiles))
    return min(t.num_tokens for t in tdp.plan(grid, counts, spec.tile_overlap))


def check_forward_settings(spec: RenderPlan, steps: int) -> None:
    """Refuse taus of the wrong count, sparse attention where stage 2 cannot route, a compute dtype
    the backend does not compute in. `steps`: stage-2 steps (sigmas - 1); tiles already resolved."""
    dtype = spec.compute_dtype
    if dtype is not None and dtype not in COMPUTE_DTYPES:
        raise SpecError(f"compute dtype {dtype!r} is not one the MLX backend computes the DiT in ({', '.join(COMPUTE_DTYPES)})")
    taus = spec.sparse_attention
    if not taus:
        return
    if len(taus) != steps:
        raise SpecError(f"--sparse-attention gives {len(taus)} tau(s); stage 2 of this render has {steps} steps "
                        f"(one tau per step)")
    tokens = stage2_forward_tokens(spec)
    if tokens < SPARSE_MIN_TOKENS:
        tiled = "per stage-2 tile" if spec.stage2_tiles not in (None, "1x1", "1x1x1") else "in stage 2"
        raise SpecError(f"--sparse-attention: {tokens} tokens {tiled}; sparse attention routes only at "
                        f">= {SPARSE_MIN_TOKENS} tokens per forward (a larger size, or fewer tiles)")


def cache_inputs(task_id: str) -> dict:
    """A pass's or tile's step-cache state, read from its previous step's task (`cache_*` outputs)."""
    return {f"cache_{n}": ref(task_id, f"cache_{n}") for n in cache_rule.NAMES}
