"""Issue #26's per-render forward settings in the plan: which tasks carry the sparse taus and the compute
dtype, and the refusals a spec gets at submit (one line each). Pure."""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.plan.dfr import canvas_frames
from coordinator.plan.graph import SPATIAL_FACTOR, SpecError, latent_frames
from ltx_engine import tdp
from ltx_engine.forward_rules import COMPUTE_DTYPES, DEFAULT_COMPUTE_DTYPE, SPARSE_MIN_TOKENS


def _dtype(spec: Mapping) -> dict:
    value = spec.get("compute_dtype")
    return {"compute_dtype": value} if value and value != DEFAULT_COMPUTE_DTYPE else {}


def stage1_params(spec: Mapping) -> dict:
    """Stage 1 runs the compute dtype; its attention stays dense."""
    return _dtype(spec)


def stage2_params(spec: Mapping) -> dict:
    """Stage 2 carries the taus (a tiled stage 2 gives each step's forwards their own, `stage2.py`)."""
    taus = spec.get("sparse_attention")
    return _dtype(spec) | ({"sparse_attention": [float(t) for t in taus]} if taus else {})


def stage2_forward_tokens(spec: Mapping) -> int:
    """Generated video tokens of the smallest stage-2 forward (a tile's, when tiled)."""
    grid = (latent_frames(canvas_frames(spec)), spec["height"] // SPATIAL_FACTOR, spec["width"] // SPATIAL_FACTOR)
    tiles = spec.get("stage2_tiles")
    if tiles in (None, "1x1", "1x1x1"):
        return grid[0] * grid[1] * grid[2]
    counts = tdp.parse_tile_counts(str(tiles))
    return min(t.num_tokens for t in tdp.plan(grid, counts, int(spec["tile_overlap"])))


def check_forward_settings(spec: Mapping, steps: int) -> None:
    """Refuse taus of the wrong count, sparse attention where stage 2 cannot route, a compute dtype
    the backend does not compute in. `steps`: stage-2 steps (sigmas - 1); tiles already resolved."""
    dtype = spec.get("compute_dtype")
    if dtype is not None and dtype not in COMPUTE_DTYPES:
        raise SpecError(f"compute dtype {dtype!r} is not one the MLX backend computes the DiT in ({', '.join(COMPUTE_DTYPES)})")
    taus = spec.get("sparse_attention")
    if not taus:
        return
    if len(taus) != steps:
        raise SpecError(f"--sparse-attention gives {len(taus)} tau(s); stage 2 of this render has {steps} steps "
                        f"(one tau per step)")
    tokens = stage2_forward_tokens(spec)
    if tokens < SPARSE_MIN_TOKENS:
        tiled = "per stage-2 tile" if spec.get("stage2_tiles") not in (None, "1x1", "1x1x1") else "in stage 2"
        raise SpecError(f"--sparse-attention: {tokens} tokens {tiled}; sparse attention routes only at "
                        f">= {SPARSE_MIN_TOKENS} tokens per forward (a larger size, or fewer tiles)")
