"""Block-sparse self-attention for stage 2: the Sol-Attn routing the MLX port ports (`LTX2_SOL_TAU`).

Rules (docs/ARCHITECTURE.md, "Sparse stage-2 attention", states them with our reading of the port):
- each head's T tokens are cut into 64-token blocks (the last may be shorter, length L_j);
  a block's query / key centroid is the mean of its queries / keys, its value mean the mean of its values;
- centroid scores S_ij = scale * qc_i . kc_j; query block i routes key block j exactly when
  S_ij >= mean_j(S_i) + tau * std_j(S_i) (population std over all key blocks), when |i - j| <= 1, or when j
  holds a token of block i shifted by one latent frame (`frame_tokens`) before or after (same (h, w));
- every key block left out enters the same softmax once, as its key centroid with a ln(L_j) bias and its
  value mean: exp(s + ln L) * mean(V) = exp(s) * sum(V), Sol's length-weighted correction;
- tau = -inf routes every block: the routed attention is then dense attention, and runs as the dense kernel
  (bit-identical to `mx.fast.scaled_dot_product_attention`).

`attend` is what an attention module calls; `routed_attention` is the plain-MLX path that runs everywhere.
On Metal the kernel of `ltx_engine.models.sparse_metal` (`mx.fast.metal_kernel`) runs where
`forward_rules.sparse_path` says so — a rule of (head width, dtype, device), never of call history; its
agreement with the plain path is held by the parity tests on a Mac, not checked per process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ltx_engine.rules.forward_rules import SPARSE_BLOCK as BLOCK
from ltx_engine.rules.forward_rules import SPARSE_MIN_TOKENS as MIN_TOKENS
from ltx_engine.rules.forward_rules import sparse_path

CHUNK_BYTES = 96 * 2**20  # gathered keys + values + scores of one chunk of query blocks


@dataclass(frozen=True)
class Routing:
    """One forward's sparse setting: its step's tau and the tokens of one latent frame (0: none known)."""

    tau: float
    frame_tokens: int


def frame_tokens(positions: np.ndarray) -> int:
    """Tokens of one latent frame: the leading run of tokens sharing the first token's time start.

    positions (B, n_axes, T, 2); appended conditioning tokens (other times) do not change it, and a
    tile's frame is its own h x w."""
    times = np.asarray(positions)[0, 0, :, 0]
    if times.size == 0:
        return 0
    differ = np.nonzero(times != times[0])[0]
    return int(differ[0]) if differ.size else int(times.size)


def block_lengths(tokens: int) -> np.ndarray:
    nb = -(-tokens // BLOCK)
    return np.minimum(BLOCK, tokens - BLOCK * np.arange(nb)).astype(np.int64)


def structural_blocks(tokens: int, frame: int) -> np.ndarray:
    """(nb, nb) bool: the neighbours |i - j| <= 1 and the blocks one latent frame before and after."""
    lengths = block_lengths(tokens)
    nb = lengths.size
    i = np.arange(nb)
    out = np.abs(i[:, None] - i[None, :]) <= 1
    if 0 < frame < tokens:
        first, last = BLOCK * i, BLOCK * i + lengths - 1
        for shift in (-frame, frame):
            lo, hi = np.clip(first + shift, 0, tokens - 1), np.clip(last + shift, 0, tokens - 1)
            inside = (last + shift >= 0) & (first + shift <= tokens - 1)
            j = np.arange(nb)[None, :]
            out |= inside[:, None] & (j >= (lo // BLOCK)[:, None]) & (j <= (hi // BLOCK)[:, None])
    return out


def _blocks(x: mx.array, tokens: int) -> mx.array:
    """(BH, T, D) -> (BH, nb, 64, D) float32, zero-padded."""
    nb = -(-tokens // BLOCK)
    x = x.astype(mx.float32)
    if nb * BLOCK != tokens:
        x = mx.pad(x, [(0, 0), (0, nb * BLOCK - tokens), (0, 0)])
    return x.reshape(x.shape[0], nb, BLOCK, x.shape[-1])


def centroids(xb: mx.array, lengths: mx.array) -> mx.array:
    """(BH, nb, 64, D) zero-padded blocks -> (BH, nb, D) block means."""
    return xb.sum(axis=2) / lengths[None, :, None]


def route(qc: mx.array, kc: mx.array, scale: float, tau: float, structural: mx.array) -> mx.array:
    """(BH, nb, nb) bool: the key blocks each query block attends to exactly."""
    if tau == -math.inf:
        return mx.ones((qc.shape[0], qc.shape[1], kc.shape[1]), dtype=mx.bool_)
    s = (qc @ kc.swapaxes(-1, -2)) * scale
    mean = s.mean(axis=-1, keepdims=True)
    std = mx.sqrt(mx.maximum(((s - mean) ** 2).mean(axis=-1, keepdims=True), 0.0))
    return (s >= mean + tau * std) | structural[None]


def _chunk_rows(bh: int, kmax: int, dim: int) -> int:
    per_row = bh * kmax * BLOCK * (2 * dim + BLOCK) * 4
    return max(1, CHUNK_BYTES // max(1, per_row))


def routed_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, selected: mx.array) -> mx.array:
    """Attention of (B, H, T, D) q/k/v over the routed key blocks plus the left-out blocks' centroids.

    selected (B*H, nb, nb) bool. Plain MLX, in float32; returns q's dtype."""
    b, h, t, d = q.shape
    bh, lengths = b * h, mx.array(block_lengths(t).astype(np.float32))
    qb, kb, vb = (_blocks(x.reshape(bh, t, d), t) for x in (q, k, v))
    nb = qb.shape[1]
    kc, vm = centroids(kb, lengths), centroids(vb, lengths)
    counts = selected.sum(axis=-1)
    kmax = int(counts.max().item())
    cols = mx.arange(nb)
    order = mx.argsort(mx.where(selected, cols, nb + cols), axis=-1)[..., :kmax]  # selected first, in order
    valid = mx.arange(kmax)[None, None, :] < counts[..., None]
    token = (order[..., None] * BLOCK + mx.arange(BLOCK)) < t  # (BH, nb, kmax, 64): a real key token
    keep = (valid[..., None] & token).reshape(bh, nb, 1, kmax * BLOCK)
    log_len = mx.log(lengths)
    rows = mx.arange(bh)[:, None, None]
    outs = []
    step = _chunk_rows(bh, kmax, d)
    for c0 in range(0, nb, step):
        c1 = min(nb, c0 + step)
        ids = order[:, c0:c1]
        ks = kb[rows, ids].reshape(bh, c1 - c0, kmax * BLOCK, d)
        vs = vb[rows, ids].reshape(bh, c1 - c0, kmax * BLOCK, d)
        qs = qb[:, c0:c1]
        exact = mx.where(keep[:, c0:c1], (qs @ ks.swapaxes(-1, -2)) * scale, -mx.inf)
        cent = (qs @ kc[:, None].swapaxes(-1, -2)) * scale + log_len
        cent = mx.where(selected[:, c0:c1, None, :], -mx.inf, cent)
        top = mx.maximum(exact.max(axis=-1, keepdims=True), cent.max(axis=-1, keepdims=True))
        pe, pc = mx.exp(exact - top), mx.exp(cent - top)
        den = pe.sum(axis=-1, keepdims=True) + pc.sum(axis=-1, keepdims=True)
        outs.append((pe @ vs + pc @ vm[:, None]) / den)
    out = mx.concatenate(outs, axis=1).reshape(bh, nb * BLOCK, d)[:, :t]
    return out.reshape(b, h, t, d).astype(q.dtype)


def selection(q: mx.array, k: mx.array, scale: float, routing: Routing) -> mx.array:
    """(B*H, nb, nb) routed blocks of one call."""
    b, h, t, d = q.shape
    lengths = mx.array(block_lengths(t).astype(np.float32))
    qc = centroids(_blocks(q.reshape(b * h, t, d), t), lengths)
    kc = centroids(_blocks(k.reshape(b * h, t, d), t), lengths)
    structural = mx.array(structural_blocks(t, routing.frame_tokens))
    return route(qc, kc, scale, routing.tau, structural)


def attend(q: mx.array, k: mx.array, v: mx.array, scale: float, routing: Routing | None) -> mx.array:
    """Self-attention of one call: dense below MIN_TOKENS or without routing, else routed; a call whose
    routing selects every block is dense attention and runs the dense kernel."""
    t = q.shape[2]
    if routing is None or t < MIN_TOKENS:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
    selected = selection(q, k, scale, routing)
    if bool(selected.all().item()):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
    return kernel_for(q.shape[-1], q.dtype)(q, k, v, scale, selected)


def kernel_for(head_dim: int, dtype: mx.Dtype):
    """The routed attention `forward_rules.sparse_path` picks for this call: stateless, so two processes
    with different histories run the same path for the same shape."""
    if sparse_path(head_dim, str(dtype).removeprefix("mlx.core."), mx.metal.is_available()) == "metal":
        from ltx_engine.models.sparse_metal import routed_attention_metal

        return routed_attention_metal
    return routed_attention
