"""The rules of the per-render forward settings, as plain tables the planner checks specs against (pure:
no model library), and the engine's sparse attention and compute dtype follow."""

from __future__ import annotations

SPARSE_BLOCK = 64          # tokens per routing block
SPARSE_MIN_TOKENS = 4096   # a self-attention call with fewer tokens stays dense
SPARSE_DENSE_BLOCKS = 1    # transformer blocks 0..n-1 keep dense self-attention
COMPUTE_DTYPES = ("float32", "float16", "bfloat16")  # what the DiT's attention / feed-forward can run in
DEFAULT_COMPUTE_DTYPE = "float32"

# The Metal routed-attention kernel keeps a float32 accumulator of the head's width per thread; past this
# width it is not built for (the DiT's heads are 128 wide, the audio stream's 64).
SPARSE_METAL_MAX_HEAD_DIM = 256


def sparse_path(head_dim: int, dtype: str, metal: bool) -> str:
    """"metal" or "plain": which routed attention a sparse call runs, from its shape, dtype and device
    alone. Every process computes it alike, whatever it ran before, so a tile takes the same path on
    every Mac of a class and under `render --local` (the two paths agree only to ~1e-4, so a choice that
    followed call history — the first call plain, later ones the kernel — broke bit-identity)."""
    if metal and dtype in COMPUTE_DTYPES and 0 < head_dim <= SPARSE_METAL_MAX_HEAD_DIM:
        return "metal"
    return "plain"
