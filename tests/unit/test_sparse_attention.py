"""Sparse stage-2 attention: tau = -inf is dense bit for bit; finite tau equals a numpy reference written
here from the routing rules (docs/ARCHITECTURE.md, "Sparse stage-2 attention")."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine.models import sparse_attention as sa
from ltx_engine.rules.forward_rules import SPARSE_METAL_MAX_HEAD_DIM, sparse_path


def _qkv(t: int, heads: int = 2, dim: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    # a slowly varying signal plus noise, so centroid scores differ between blocks
    base = np.cumsum(rng.normal(size=(1, heads, t, dim)), axis=2) / 40.0
    q, k, v = (base + rng.normal(size=(1, heads, t, dim)) for _ in range(3))
    return [x.astype(np.float32) for x in (q, k, v)]


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, tau: float, frame: int) -> np.ndarray:
    """Per head and query block, straight from the rules, in float64: (output, routed blocks per head)."""
    _, heads, t, _ = q.shape
    starts = list(range(0, t, 64))
    blocks = [(s, min(t, s + 64)) for s in starts]
    out = np.zeros(q.shape, np.float64)
    routed = np.zeros((heads, len(blocks), len(blocks)), bool)
    for h in range(heads):
        qc = np.stack([q[0, h, a:b].mean(0) for a, b in blocks]).astype(np.float64)
        kc = np.stack([k[0, h, a:b].mean(0) for a, b in blocks]).astype(np.float64)
        vm = np.stack([v[0, h, a:b].mean(0) for a, b in blocks]).astype(np.float64)
        for i, (a, b) in enumerate(blocks):
            s = scale * kc @ qc[i]
            chosen = set(np.nonzero(s >= s.mean() + tau * s.std())[0]) | {i - 1, i, i + 1}
            if 0 < frame < t:
                for shift in (-frame, frame):
                    tokens = [x + shift for x in range(a, b) if 0 <= x + shift < t]
                    chosen |= {x // 64 for x in tokens}
            chosen = sorted(j for j in chosen if 0 <= j < len(blocks))
            routed[h, i, chosen] = True
            keys = np.concatenate([np.arange(*blocks[j]) for j in chosen])
            left = [j for j in range(len(blocks)) if j not in chosen]
            for row in range(a, b):
                qt = q[0, h, row].astype(np.float64)
                logits = np.concatenate([scale * k[0, h, keys] @ qt,
                                         [scale * kc[j] @ qt + math.log(blocks[j][1] - blocks[j][0]) for j in left]])
                values = np.concatenate([v[0, h, keys], vm[left]]) if left else v[0, h, keys]
                w = np.exp(logits - logits.max())
                out[0, h, row] = (w / w.sum()) @ values
    return out, routed


@pytest.mark.timeout(120)
def test_minus_inf_is_dense_bit_for_bit():
    q, k, v = (mx.array(x) for x in _qkv(4160))
    scale = 1 / math.sqrt(16)
    dense = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
    routed = sa.attend(q, k, v, scale, sa.Routing(-math.inf, 320))
    assert np.array_equal(np.array(dense), np.array(routed))


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("t", "frame", "tau"), [(4160, 320, 1.0), (4130, 200, 0.5), (4096, 0, 1.5)])
def test_finite_tau_matches_numpy_reference(t, frame, tau):
    q, k, v = _qkv(t, seed=t)
    scale = 1 / math.sqrt(16)
    selected = sa.selection(mx.array(q), mx.array(k), scale, sa.Routing(tau, frame))
    density = float(np.array(selected).mean())
    assert 0.02 < density < 0.9, density  # routed, and really sparse
    got = np.array(sa.attend(mx.array(q), mx.array(k), mx.array(v), scale, sa.Routing(tau, frame)))
    want, routed = reference(q, k, v, scale, tau, frame)
    assert np.array_equal(np.array(selected), routed)
    assert np.max(np.abs(got - want)) <= 1e-5 * max(1.0, float(np.max(np.abs(want))))


@pytest.mark.timeout(120)
def test_routed_path_with_every_block_equals_dense_closely():
    """The gathered path itself (not the dense shortcut) at full routing is dense attention."""
    q, k, v = (mx.array(x) for x in _qkv(4100))
    nb = 65
    out = sa.routed_attention(q, k, v, 0.25, mx.ones((2, nb, nb), dtype=mx.bool_))
    dense = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25)
    assert np.max(np.abs(np.array(out) - np.array(dense))) <= 1e-5 * float(np.max(np.abs(np.array(dense))))


def test_below_4096_tokens_stays_dense():
    q, k, v = (mx.array(x) for x in _qkv(4095))
    dense = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25)
    assert np.array_equal(np.array(sa.attend(q, k, v, 0.25, sa.Routing(1.0, 64))), np.array(dense))


def test_frame_tokens_is_the_leading_run_of_one_time():
    pos = np.zeros((1, 3, 10, 2), np.float32)
    pos[0, 0, 4:, 0] = 1.0
    pos[0, 0, 8:, 0] = -1.0  # appended tokens at another time
    assert sa.frame_tokens(pos) == 4


def test_structural_blocks_hold_neighbours_and_the_frames_around():
    s = sa.structural_blocks(64 * 10, 128)  # a frame is two blocks
    assert s[5].nonzero()[0].tolist() == [3, 4, 5, 6, 7]
    assert s[0].nonzero()[0].tolist() == [0, 1, 2]


def test_the_sparse_path_is_a_rule_of_shape_dtype_and_device():
    assert sparse_path(128, "bfloat16", metal=True) == "metal" and sparse_path(64, "float32", metal=True) == "metal"
    assert sparse_path(128, "bfloat16", metal=False) == "plain"  # off Metal: the plain MLX path
    assert sparse_path(SPARSE_METAL_MAX_HEAD_DIM + 1, "float16", metal=True) == "plain"  # not built that wide
    assert sparse_path(128, "int8", metal=True) == "plain"
    expected = sa.routed_attention if not mx.metal.is_available() else None
    if expected is not None:
        assert sa.kernel_for(128, mx.bfloat16) is expected


_CHOOSE = """
import sys
import mlx.core as mx
import numpy as np
from ltx_engine.models import sparse_attention as sa
from ltx_engine.rules.forward_rules import sparse_path
if sys.argv[1] == "history":  # other shapes and dtypes first, as a worker's earlier tiles would
    rng = np.random.default_rng(0)
    for dtype, t in ((mx.float32, 4160), (mx.bfloat16, 4224)):
        q, k, v = (mx.array(rng.standard_normal((1, 2, t, 16)).astype(np.float32)).astype(dtype) for _ in range(3))
        mx.eval(sa.attend(q, k, v, 0.25, sa.Routing(1.0, 320)))
chosen = [sa.kernel_for(d, dt).__name__ for d, dt in ((128, mx.bfloat16), (64, mx.float32), (16, mx.float16))]
print(chosen, [sparse_path(d, dt, True) for d, dt in ((128, "bfloat16"), (512, "float32"))])
"""


@pytest.mark.timeout(180)
def test_two_processes_with_different_histories_choose_the_same_path():
    """A fresh process and one that already ran routed calls pick the same kernel for each shape: the
    choice is computed, never remembered (the old first-call check made it history)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    runs = [subprocess.run([sys.executable, "-c", _CHOOSE, mode], capture_output=True, text=True, timeout=150,
                           cwd=root, env=env) for mode in ("fresh", "history")]
    assert all(r.returncode == 0 for r in runs), [r.stderr[-500:] for r in runs]
    assert runs[0].stdout == runs[1].stdout and "['metal', 'plain']" in runs[0].stdout
