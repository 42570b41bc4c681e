"""`farm bench relay`: what Prompt Relay's mask (`--segment`) costs each stage, on this machine.

Why: with segments the text cross-attention's mask is no longer one row shared by every query token but one
row per token (T x the text's 1024 columns), built in numpy at every forward (`ltx_engine.relay.text_mask`,
both streams) and read by the attention of every block. Per stage of a render size (stage 1 at half size,
8 steps; stage 2 at full size, 3 steps), in interleaved pairs (the order alternating), medians:
- `build`: both streams' masks, numpy to the arrays the DiT reads;
- `forward`: one DiT forward through the tiles' path (`denoise.forward_tokens`: the masks built inside),
  seeded at the tiny pack's widths, `--layers` blocks, 1024 text columns, without and with two segments;
- `attention`: one text cross-attention core at the 22B's video width (32 heads x 128) without and with the
  per-token mask; the mask touches nothing else, so its ratio times the text attention's modelled share
  of a 22B block (`text_share`) is the full-size forward's extra beyond the build.
Measured figures: docs/performance.md.
"""

from __future__ import annotations

import json
import statistics
import time

import mlx.core as mx
import numpy as np
import typer

from ltx_engine.denoise import forward_tokens
from ltx_engine.models.patchify import audio_positions, video_positions
from ltx_engine.models.transformer import LTXModel, TransformerConfig, tiny_config
from ltx_engine.relay import text_mask
from ltx_engine.rules.prompt_relay import RELAY, RelayTable

COLUMNS, HEADS, HEAD_DIM = 1024, 32, 128  # the text length; the 22B's video heads
STAGES = (("stage 1", 2, 8), ("stage 2", 1, 3))  # name, size divisor, distilled steps


def _model(layers: int) -> LTXModel:
    mx.random.seed(0)
    model = LTXModel(TransformerConfig.from_config({"transformer": tiny_config() | {"num_layers": layers}}))
    mx.eval(model.parameters())
    return model


def _inputs(grid: tuple[int, int, int], audio_frames: int, fps: float) -> tuple[dict, dict]:
    """A tile-shaped forward's tokens (the whole stage) and its contexts with a two-segment relay table."""
    rng, cfg = np.random.default_rng(1), tiny_config()
    f, h, w = grid
    tokens = {"latent": rng.normal(size=(1, f * h * w, 128)).astype(np.float32),
              "timesteps": np.full((1, f * h * w), 0.725, np.float32),
              "positions": np.array(video_positions(1, f, h, w, fps), np.float32),
              "audio_latent": rng.normal(size=(1, audio_frames, 128)).astype(np.float32),
              "audio_mask": np.ones((1, audio_frames, 1), np.float32),
              "audio_positions": np.array(audio_positions(1, audio_frames), np.float32)}
    seconds = (8 * (f - 1) + 1) / fps
    table = RelayTable(fps, 1e-3, 1.0, ((40, 60, 0.0, seconds / 2), (60, 80, seconds / 2, seconds)))
    contexts = {"video_context": rng.normal(size=(1, COLUMNS, cfg["cross_attention_dim"])).astype(np.float32),
                "audio_context": rng.normal(size=(1, COLUMNS, cfg["audio_cross_attention_dim"])).astype(np.float32),
                "context_mask": np.ones((1, COLUMNS), np.float32), RELAY: table.to_array()}
    return tokens, contexts


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _pairs(plain, relay, pairs: int) -> dict:
    """Interleaved (plain, relay) seconds, the order alternating; medians, the extra and the ratios' spread."""
    p, r = [], []
    for i in range(pairs):
        first, second = (plain, relay) if i % 2 == 0 else (relay, plain)
        a, b = _seconds(first), _seconds(second)
        p.append(a if i % 2 == 0 else b)
        r.append(b if i % 2 == 0 else a)
    ratios = [y / x for x, y in zip(p, r, strict=True)]
    return {"plain_s": round(statistics.median(p), 4), "relay_s": round(statistics.median(r), 4),
            "extra_s": round(statistics.median(y - x for x, y in zip(p, r, strict=True)), 4),
            "ratio": round(statistics.median(ratios), 3), "spread": [round(min(ratios), 3), round(max(ratios), 3)]}


def _build(tokens: dict, contexts: dict) -> None:
    for mask in (text_mask(contexts, tokens["positions"]), text_mask(contexts, tokens["audio_positions"], audio=True)):
        mx.eval(mx.array(mask))


def attention_dtype() -> mx.Dtype:
    """bfloat16 as a pack's DiT computes on a Mac's GPU; float32 on MLX's CPU path (its bfloat16 is emulated)."""
    return mx.bfloat16 if mx.default_device() == mx.gpu else mx.float32


def _attention(tokens: int, mask: np.ndarray, pairs: int) -> dict:
    """One text cross-attention at the 22B's video width, the shared one-row mask vs the per-token one."""
    rng, dtype = np.random.default_rng(2), attention_dtype()
    q = mx.array(rng.normal(size=(1, HEADS, tokens, HEAD_DIM)).astype(np.float32)).astype(dtype)
    k, v = (mx.array(rng.normal(size=(1, HEADS, COLUMNS, HEAD_DIM)).astype(np.float32)).astype(dtype)
            for _ in range(2))
    one, each = mx.zeros((1, 1, 1, COLUMNS), dtype), mx.array(mask).astype(dtype)
    scale = HEAD_DIM ** -0.5
    mx.eval(q, k, v, one, each)
    return _pairs(lambda: mx.eval(mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=one)),
                  lambda: mx.eval(mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=each)), pairs)


def text_share(tokens: int, audio_tokens: int) -> float:
    """The text cross-attention core's share of a 22B block's multiply-adds per video token (modelled): the
    only part the mask touches. Per token: q/k/v/o and the FF (4 + 8 D^2), the text attention's q/o
    projections (2 D^2), the audio<->video attentions' projections (4 D x 2048), the self-attention core
    (2 T D) and the text one (2 L D); the text's own k/v (2 L D C / T)."""
    d, audio_inner = HEADS * HEAD_DIM, 2048
    text_core = 2 * COLUMNS * d
    total = 14 * d * d + 4 * d * audio_inner + 2 * tokens * d + 2 * audio_tokens * audio_inner + text_core
    return text_core / (total + 2 * COLUMNS * d * d / tokens)


def measure(grid: tuple[int, int, int], audio_frames: int, fps: float, layers: int, pairs: int) -> dict:
    model, (tokens, contexts) = _model(layers), _inputs(grid, audio_frames, fps)
    plain = {k: v for k, v in contexts.items() if k != RELAY}
    build = statistics.median(_seconds(lambda: _build(tokens, contexts)) for _ in range(max(pairs, 3)))
    forward = _pairs(lambda: forward_tokens(model, tokens, 0.725, plain),
                     lambda: forward_tokens(model, tokens, 0.725, contexts), pairs)
    n = grid[0] * grid[1] * grid[2]
    attention = _attention(n, text_mask(contexts, tokens["positions"])[0, 0], pairs)
    share = text_share(n, audio_frames)
    return {"tokens": n, "audio_tokens": audio_frames, "build_s": round(build, 5), "forward": forward,
            "attention": attention, "text_share": round(share, 4),
            "full_size_extra": round((attention["ratio"] - 1.0) * share, 5)}


def run(height: int, width: int, frames: int, fps: float, layers: int, pairs: int, as_json: bool) -> None:
    if height % 64 or width % 64 or (frames - 1) % 8:
        raise typer.BadParameter("-H/-W multiples of 64, -f of the form 8k+1")
    audio_frames = round(frames / fps * 25)
    results = {}
    for name, div, steps in STAGES:
        grid = ((frames - 1) // 8 + 1, height // div // 32, width // div // 32)
        results[name] = measure(grid, audio_frames, fps, layers, pairs) | {"steps": steps}
        if not as_json:
            _print(name, results[name], layers)
    if as_json:
        typer.echo(json.dumps({"size": [width, height, frames], "layers": layers, "pairs": pairs,
                               "device": str(mx.default_device()), "attention_dtype": str(attention_dtype()),
                               "stages": results}, indent=2))


def _print(name: str, r: dict, layers: int) -> None:
    f, a, steps = r["forward"], r["attention"], r["steps"]
    dtype = str(attention_dtype()).split(".")[-1]
    typer.echo(f"{name}: {r['tokens']} video + {r['audio_tokens']} audio tokens x {COLUMNS} text columns, {steps} steps")
    typer.echo(f"  mask build, both streams        {r['build_s'] * 1000:8.2f} ms a forward, "
               f"{steps * r['build_s'] * 1000:.1f} ms a stage")
    typer.echo(f"  tiny-width forward ({layers} blocks)  {f['plain_s'] * 1000:8.1f} -> {f['relay_s'] * 1000:8.1f} ms "
               f"x{f['ratio']:.3f} [{f['spread'][0]:.3f}-{f['spread'][1]:.3f}]")
    typer.echo(f"  text attention 32x128 {dtype:>8}  {a['plain_s'] * 1000:8.1f} -> {a['relay_s'] * 1000:8.1f} ms "
               f"x{a['ratio']:.3f} [{a['spread'][0]:.3f}-{a['spread'][1]:.3f}]")
    typer.echo(f"  22B block (modelled): the text attention is {r['text_share']:.1%} of it: "
               f"{r['full_size_extra']:+.2%} a forward, plus the build")
