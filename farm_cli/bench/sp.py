"""`farm bench sp`: stage 1's DiT forward sequence-parallel on 2 workers vs unsplit on 1, measured here.

Why: stage 1 runs on one Mac and becomes the render's largest serial part once stage 2 and the decode
are spread. This measures what splitting its tokens buys: the tiny pack's DiT layout at a
token count where attention dominates, one process pinned to one core per worker (a core stands for a
Mac), a ring group of 2 over 127.0.0.1 against one process, in interleaved pairs (the order alternates,
so load drifting on the machine hits both sides). Per pair: the forward's wall seconds each way (the
ring's slower rank), their ratio, the bytes one rank receives per forward (= per stage-1 step) and
the seconds those gathers take alone on this link. Then the projection for 4 Macs: the parallel
fraction p from the 2-worker compute (its wall less its wire time), and
`t4 = t1·(1 - p) + t1·p/4 + bytes(k=4) / bandwidth` over 10 GbE (1.1 GB/s) and Thunderbolt 5 (8 GB/s),
with bytes(k=4) from the same formula the 2-worker count checks (`sequence_parallel.forward_bytes`);
and the same for the full-size LTX-2.3 stage 1 of 1920x1088x121 from the cost model.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import typer

LINKS = (("10 GbE", 1.1e9), ("Thunderbolt 5", 8e9))
RANK_TIMEOUT_S = 900
ONE_CORE = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _env(group: str = "ring") -> dict:
    return {**os.environ, **ONE_CORE, "SP_BACKEND": group}


def _one(grid: tuple[int, int, int], repeats: int, folder: Path) -> dict:
    out = folder / "one.json"
    subprocess.run([sys.executable, "-m", "farm_cli.bench.sp_rank", "one", *map(str, grid), str(repeats), str(out)],
                   check=True, env=_env(), timeout=RANK_TIMEOUT_S)
    return json.loads(out.read_text())


def _sp(grid: tuple[int, int, int], repeats: int, folder: Path, group: str, k: int = 2) -> dict:
    from ltx_engine.parallel.sp_group import run_ring

    out = folder / "sp.json"
    ranks = run_ring([sys.executable, "-m", "farm_cli.bench.sp_rank", "sp", *map(str, grid), str(repeats), str(out)],
                     k, RANK_TIMEOUT_S, env=_env(group))
    bad = [r for r in ranks if r.returncode != 0]
    if bad:
        raise RuntimeError(f"rank {bad[0].rank} ended {bad[0].returncode}: {bad[0].output[-1500:]}")
    results = [json.loads(Path(f"{out}" if r == 0 else f"{out}.{r}").read_text()) for r in range(k)]
    return {**results[0], "forward_s": max(r["forward_s"] for r in results),
            "wire_s": max(r["wire_s"] for r in results)}


def _full_size_lines(macs: int, chip: str) -> list[str]:
    """The full-size DiT (48 layers, 4096/2048 wide, bf16) on stage 1 of 1920x1088x121: 8,160 tokens, with
    the step model `farm bench model`'s simulation uses (sp_degree.gang_seconds: the audio / AdaLN part
    replicated, the rest split, the all-gathers over the link), then the whole render as that simulation
    runs it (stage 1's degree chosen at lease time)."""
    from coordinator.plan import costs, placement, sp_degree
    from farm_cli.bench.model import SPEC, _plan
    from ltx_engine.rules.sp_plan import ShardPlan, forward_bytes

    tokens = 17 * 30 * 16
    forward = costs.dit_forward_s(tokens)
    one = forward / costs.chip_speed(chip)
    moved = forward_bytes(ShardPlan(tokens, macs), 48, 4096, 2048, 2, 128)
    lines = [f"full size, stage 1 of 1920x1088x121 ({tokens} tokens), {chip}: {one:.1f} s/step on one "
             f"(cost model); {macs} Macs receive {moved / 1e9:.2f} GB per step per rank"]
    tasks, slots, _ = _plan({**SPEC, "stage2_tiles": "2x2", "decode_tiles": "auto"}, macs, chip, 96, "p")
    for name, bw in LINKS:
        t = sp_degree.gang_seconds(forward, 1, tokens, macs, 1 / costs.chip_speed(chip), bw)
        wall = max(p.end for p in placement.simulate(tasks, [placement.Slot(**vars(s)) for s in slots],
                                                     sp=placement.SpRule(bw)))
        lines.append(f"  {name}: {t - moved / bw:.1f} s compute + {moved / bw:.1f} s wire = {t:.1f} s/step, "
                     f"{one / t:.2f}x one Mac (audio and AdaLN replicated, no overlap of wire and compute); "
                     f"the whole render {wall:.0f} s on {macs} (farm bench model)")
    return lines


def _projection(t1: float, t2: float, wire2: float, tokens: int, macs: int) -> list[str]:
    from ltx_engine.models.transformer import tiny_config
    from ltx_engine.parallel.sequence_parallel import ShardPlan, forward_bytes

    c = tiny_config()
    p = min(1.0, max(0.0, 2 * (1 - (t2 - wire2) / t1)))
    moved = forward_bytes(ShardPlan(tokens, macs), c["num_layers"], c["num_attention_heads"] * c["attention_head_dim"],
                          c["audio_num_attention_heads"] * c["audio_attention_head_dim"], 4, c["out_channels"])
    lines = [f"projection, this DiT on {macs} Macs: parallel fraction p = {p:.3f} (from the 2-worker compute), "
             f"{moved / 1e6:.2f} MB per step per rank"]
    for name, bw in LINKS:
        t = t1 * (1 - p) + t1 * p / macs + moved / bw
        lines.append(f"  {name}: {t:.2f} s/step vs {t1:.2f} s on one: {t1 / t:.2f}x")
    return lines


def run(frames: int, height: int, width: int, pairs: int, repeats: int, macs: int, chip: str,
        group: str = "ring") -> None:
    if min(frames, height, width, pairs, repeats) < 1:
        raise typer.BadParameter("latent frames, height, width, --pairs and --repeats must be at least 1")
    grid = (frames, height, width)
    tokens = frames * height * width
    typer.echo(f"stage-1 forward, tiny pack DiT layout, {tokens} video tokens + 126 audio, one core per worker; "
               f"{pairs} interleaved pairs of {repeats} timed forwards; the 2 workers' group: {group}")
    ones, sps = [], []
    with tempfile.TemporaryDirectory(prefix="bench-sp-") as tmp:
        for i in range(pairs):
            order = ("one", "sp") if i % 2 == 0 else ("sp", "one")
            got = {name: _one(grid, repeats, Path(tmp)) if name == "one" else _sp(grid, repeats, Path(tmp), group)
                   for name in order}
            ones.append(got["one"]["forward_s"])
            sps.append(got["sp"])
            typer.echo(f"pair {i + 1}: 1 worker {ones[-1]:.2f} s, 2 workers SP {sps[-1]['forward_s']:.2f} s "
                       f"(wire {sps[-1]['wire_s']:.3f} s), ratio {ones[-1] / sps[-1]['forward_s']:.2f}x")
    ratios = [o / s["forward_s"] for o, s in zip(ones, sps, strict=True)]
    t1, t2 = statistics.median(ones), statistics.median(s["forward_s"] for s in sps)
    wire2 = statistics.median(s["wire_s"] for s in sps)
    moved = sps[0]["bytes_per_forward"]
    typer.echo(f"median: 1 worker {t1:.2f} s/step, 2 workers {t2:.2f} s/step, ratio {statistics.median(ratios):.2f}x "
               f"(pairs {min(ratios):.2f}-{max(ratios):.2f}); {moved / 1e6:.2f} MB per step per rank "
               f"(loopback: {wire2:.3f} s, {moved / max(wire2, 1e-9) / 1e9:.2f} GB/s)")
    for line in _projection(t1, t2, wire2, tokens, macs) + _full_size_lines(macs, chip):
        typer.echo(line)
