"""`farm bench sparse`: sparse stage-2 attention against dense on this machine, side by side.

Why: the MLX port measured Sol routing on Macs (238 -> 153 s per stage-2 step at 1088x1920x121); what it
buys depends on the machine and the token count, and only the attention gets cheaper. Per token count
(latent frames of 32 x 32 tokens, so the frame rule routes as in a render): one self-attention call and one
whole DiT forward (seeded weights at the tiny pack's widths, `--layers` blocks, block 0 dense), dense
and sparse in interleaved pairs (the order alternates per pair). Prints medians and the spread of the
per-pair ratios; `--json` gives per token count `forward_speedup` (median) and the rest. A token count
whose dense attention would not fit in the free memory (32k tokens: ~16 GiB on MLX's CPU path) is
skipped with its reason, never run into the OOM killer of a shared machine.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import mlx.core as mx
import numpy as np
import typer

from ltx_engine.denoise import forward_tokens
from ltx_engine.models import sparse_attention as sa
from ltx_engine.models.forward_options import ForwardOptions
from ltx_engine.models.patchify import video_positions
from ltx_engine.models.transformer import VIDEO_ONLY, LTXModel, TransformerConfig, tiny_config

FRAME = (32, 32)


def _qkv(tokens: int, heads: int, dim: int) -> list[mx.array]:
    rng = np.random.default_rng(tokens)
    base = np.cumsum(rng.normal(size=(1, heads, tokens, dim)), axis=2) / 40.0  # nearby tokens alike
    return [mx.array((base + rng.normal(size=base.shape)).astype(np.float32)) for _ in range(3)]


def _model(layers: int) -> LTXModel:
    mx.random.seed(0)
    model = LTXModel(TransformerConfig.from_config({"transformer": tiny_config() | {"num_layers": layers}}, VIDEO_ONLY))
    mx.eval(model.parameters())
    return model


def _forward_inputs(tokens: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(1)
    pos = np.array(video_positions(1, tokens // (FRAME[0] * FRAME[1]), *FRAME, 24.0), np.float32)
    return ({"latent": rng.normal(size=(1, tokens, 128)).astype(np.float32),
             "timesteps": np.full((1, tokens), 0.725, np.float32), "positions": pos},
            {"video_context": rng.normal(size=(1, 16, 64)).astype(np.float32)})


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _pairs(dense, sparse, pairs: int) -> dict:
    """Interleaved (dense, sparse) seconds, the order alternating; medians and the ratio's spread."""
    d, s = [], []
    for i in range(pairs):
        first, second = (dense, sparse) if i % 2 == 0 else (sparse, dense)
        a, b = _seconds(first), _seconds(second)
        d.append(a if i % 2 == 0 else b)
        s.append(b if i % 2 == 0 else a)
    ratios = [x / y for x, y in zip(d, s, strict=True)]
    return {"dense_s": round(statistics.median(d), 3), "sparse_s": round(statistics.median(s), 3),
            "speedup": round(statistics.median(ratios), 3), "spread": [round(min(ratios), 3), round(max(ratios), 3)]}


def measure(tokens: int, tau: float, pairs: int, layers: int, forward: bool) -> dict:
    cfg = tiny_config()
    heads, dim = cfg["num_attention_heads"], cfg["attention_head_dim"]
    q, k, v = _qkv(tokens, heads, dim)
    scale, routing = 1 / np.sqrt(dim), sa.Routing(tau, FRAME[0] * FRAME[1])
    density = float(np.array(sa.selection(q, k, scale, routing)).mean())
    attn = _pairs(lambda: mx.eval(mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)),
                  lambda: mx.eval(sa.attend(q, k, v, scale, routing)), pairs)
    out = {"density": round(density, 4), "attention": attn, "attention_speedup": attn["speedup"]}
    if forward:
        model, (toks, ctx) = _model(layers), _forward_inputs(tokens)
        fwd = _pairs(lambda: forward_tokens(model, toks, 0.725, ctx),
                     lambda: forward_tokens(model, toks, 0.725, ctx, ForwardOptions(sparse_tau=tau)), pairs)
        out |= {"forward": fwd, "forward_speedup": fwd["speedup"]}
    return out


def dense_bytes(tokens: int) -> int:
    """What dense attention at `tokens` holds at once on MLX's CPU path: the scores and their softmax,
    float32, per head (the tiny widths' heads)."""
    return 2 * tiny_config()["num_attention_heads"] * tokens * tokens * 4


def available_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def run(tokens: list[int], tau: float, pairs: int, layers: int, forward_max: int, as_json: bool) -> None:
    results: dict[int, dict] = {}
    for n in tokens:
        if n % (FRAME[0] * FRAME[1]) or n < sa.MIN_TOKENS:
            raise typer.BadParameter(f"--tokens {n}: a multiple of {FRAME[0] * FRAME[1]}, at least {sa.MIN_TOKENS}")
    for n in tokens:
        need, free = dense_bytes(n), available_bytes()
        if need > 0.8 * free:  # a machine shared with other work: never push it into the OOM killer
            results[n] = {"skipped": f"dense attention needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"}
            typer.echo(f"{n:>6} tokens  skipped: {results[n]['skipped']}", err=True)
            continue
        results[n] = measure(n, tau, pairs, layers, n <= forward_max)
        if not as_json:
            _print(n, results[n], layers)
    if as_json:
        typer.echo(json.dumps({"tau": tau, "pairs": pairs, "layers": layers, "device": str(mx.default_device()),
                               "tokens": results}, indent=2))


def _print(n: int, r: dict, layers: int) -> None:
    a = r["attention"]
    typer.echo(f"{n:>6} tokens  density {r['density']:.1%}  attention {a['dense_s']:.2f} -> {a['sparse_s']:.2f} s "
               f"x{a['speedup']:.2f} [{a['spread'][0]:.2f}-{a['spread'][1]:.2f}]")
    if "forward" in r:
        f = r["forward"]
        typer.echo(f"{'':>6}         forward ({layers} blocks) {f['dense_s']:.2f} -> {f['sparse_s']:.2f} s "
                   f"x{f['speedup']:.2f} [{f['spread'][0]:.2f}-{f['spread'][1]:.2f}]")
