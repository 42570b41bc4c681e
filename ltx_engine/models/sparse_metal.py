"""The routed attention as one Metal kernel (`mx.fast.metal_kernel`), for Macs.

One thread per (head, query token): an online softmax over the tokens of its block's routed key blocks,
then over the left-out blocks' centroids (ln L bias, value means), float32 inside. It is used only where
`forward_rules.sparse_path` picks it (Metal, a head width it is built for): a rule every process computes
alike. It agrees with the plain path (`sparse_attention.routed_attention`) to ~1e-4, not bit for bit, so the
choice must never depend on a process's history. Not reachable off Metal.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ltx_engine.rules.forward_rules import SPARSE_BLOCK

SOURCE = """
    uint gid = thread_position_in_grid.x;
    if (gid >= BH * T) return;
    uint bh = gid / T;
    uint t = gid % T;
    uint row = bh * NB + t / BLOCK;
    float sc = scale[0];
    float m = -INFINITY, l = 0.0f;
    float acc[D];
    for (int d = 0; d < D; d++) acc[d] = 0.0f;
    const device float* qt = q + (size_t)gid * D;
    uint count = counts[row];
    for (uint c = 0; c < count; c++) {
        uint j = order[(size_t)row * KMAX + c];
        uint end = min((j + 1) * BLOCK, (uint)T);
        for (uint s = j * BLOCK; s < end; s++) {
            const device float* ks = k + ((size_t)bh * T + s) * D;
            const device float* vs = v + ((size_t)bh * T + s) * D;
            float x = 0.0f;
            for (int d = 0; d < D; d++) x += qt[d] * ks[d];
            x *= sc;
            float mn = max(m, x), corr = exp(m - mn), p = exp(x - mn);
            l = l * corr + p;
            for (int d = 0; d < D; d++) acc[d] = acc[d] * corr + p * vs[d];
            m = mn;
        }
    }
    for (uint j = 0; j < NB; j++) {
        if (selected[(size_t)row * NB + j]) continue;
        const device float* ks = kc + ((size_t)bh * NB + j) * D;
        const device float* vs = vm + ((size_t)bh * NB + j) * D;
        float x = 0.0f;
        for (int d = 0; d < D; d++) x += qt[d] * ks[d];
        x = x * sc + log_len[j];
        float mn = max(m, x), corr = exp(m - mn), p = exp(x - mn);
        l = l * corr + p;
        for (int d = 0; d < D; d++) acc[d] = acc[d] * corr + p * vs[d];
        m = mn;
    }
    for (int d = 0; d < D; d++) out[(size_t)gid * D + d] = acc[d] / l;
"""
_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = mx.fast.metal_kernel(
            name="ltx_sol_routed_attention",
            input_names=["q", "k", "v", "kc", "vm", "log_len", "order", "counts", "selected", "scale"],
            output_names=["out"], source=SOURCE)
    return _KERNEL


def routed_attention_metal(q: mx.array, k: mx.array, v: mx.array, scale: float, selected: mx.array) -> mx.array:
    """Same contract as `sparse_attention.routed_attention`."""
    b, h, t, d = q.shape
    bh = b * h
    nb = -(-t // SPARSE_BLOCK)
    lengths = np.minimum(SPARSE_BLOCK, t - SPARSE_BLOCK * np.arange(nb)).astype(np.float32)
    flat = [x.reshape(bh, t, d).astype(mx.float32) for x in (q, k, v)]
    pad = nb * SPARSE_BLOCK - t
    blocks = [mx.pad(x, [(0, 0), (0, pad), (0, 0)]).reshape(bh, nb, SPARSE_BLOCK, d) for x in flat[1:]]
    kc, vm = (x.sum(axis=2) / mx.array(lengths)[None, :, None] for x in blocks)
    counts = selected.sum(axis=-1).astype(mx.uint32)
    kmax = max(1, int(counts.max().item()))
    cols = mx.arange(nb)
    order = mx.argsort(mx.where(selected, cols, nb + cols), axis=-1)[..., :kmax].astype(mx.uint32)
    (out,) = _kernel()(
        inputs=[flat[0], flat[1], flat[2], kc, vm, mx.array(np.log(lengths)), order, counts,
                selected.astype(mx.uint8), mx.array([scale], dtype=mx.float32)],
        template=[("BH", bh), ("T", t), ("NB", nb), ("KMAX", kmax), ("D", d), ("BLOCK", SPARSE_BLOCK)],
        grid=(bh * t, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(bh, t, d)], output_dtypes=[mx.float32])
    return out.reshape(b, h, t, d).astype(q.dtype)
