"""The rules of the per-render forward settings, as plain tables the planner checks specs against (pure:
no model library), and the engine's sparse attention and compute dtype follow."""

from __future__ import annotations

SPARSE_BLOCK = 64          # tokens per routing block
SPARSE_MIN_TOKENS = 4096   # a self-attention call with fewer tokens stays dense
SPARSE_DENSE_BLOCKS = 1    # transformer blocks 0..n-1 keep dense self-attention
COMPUTE_DTYPES = ("float32", "float16", "bfloat16")  # what the DiT's attention / feed-forward can run in
DEFAULT_COMPUTE_DTYPE = "float32"
