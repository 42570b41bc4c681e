"""`farm bench sp`: stage 1's DiT forward sequence-parallel on 2 workers vs unsplit on 1, measured here.

Why: stage 1 runs on one Mac and becomes the render's largest serial part once stage 2 and the decode
are spread. This measures what splitting its tokens buys: the tiny pack's DiT layout at a
token count where attention dominates, one process pinned to one core per worker (a core stands for a
Mac), a ring group of 2 over 127.0.0.1 against one process, in interleaved pairs (the order alternates,
so load drifting on the machine hits both sides). Per pair: the forward's wall seconds each way (the
ring's slower rank), their ratio, the bytes one rank receives per forward (= per stage-1 step) and
the seconds those gathers take alone on this link. Then the projection for 4 Macs: the parallel
fraction p from the 2-worker compute (its wall less its wire time), and
`t4 = c4 + exposed wire`, `c4 = t1·(1 - p) + t1·p/4`, over 10 GbE (1.1 GB/s) and Thunderbolt 5 (8 GB/s):
each gather's bytes(k=4) over the link (the formula the 2-worker count checks, `sp_plan.site_bytes`)
less the compute behind it (`sp_plan.exposed_wire_s`: the shares of c4 this bench measures behind the
self and video->audio K/V over the socket group, kept as `OVERLAP_SHARES`); and the same for the
full-size LTX-2.3 stage 1 of 1920x1088x121 from the cost model. `--dit bench` times the DiT of
`farm pack tiny --dit bench` (4x64 wide, 8 blocks, 1024 text rows as its pack's contexts) instead of the
tiny one. Beside the wall seconds, each side's CPU seconds per forward (the busier rank's): on a shared,
loaded machine they tell what a forward costs, where the wall also holds the other processes' load.
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


def _one(dit: str, grid: tuple[int, int, int], repeats: int, folder: Path) -> dict:
    out = folder / "one.json"
    subprocess.run([sys.executable, "-m", "farm_cli.bench.sp_rank", "one", dit, *map(str, grid), str(repeats), str(out)],
                   check=True, env=_env(), timeout=RANK_TIMEOUT_S)
    return json.loads(out.read_text())


def _sp(dit: str, grid: tuple[int, int, int], repeats: int, folder: Path, group: str, k: int = 2) -> dict:
    from ltx_engine.parallel.sp_group import run_ring

    out = folder / "sp.json"
    ranks = run_ring([sys.executable, "-m", "farm_cli.bench.sp_rank", "sp", dit, *map(str, grid), str(repeats), str(out)],
                     k, RANK_TIMEOUT_S, env=_env(group))
    bad = [r for r in ranks if r.returncode != 0]
    if bad:
        raise RuntimeError(f"rank {bad[0].rank} ended {bad[0].returncode}: {bad[0].output[-1500:]}")
    results = [json.loads(Path(f"{out}" if r == 0 else f"{out}.{r}").read_text()) for r in range(k)]
    got = {**results[0], **{key: max(r[key] for r in results) for key in results[0] if key.endswith(("forward_s", "cpu_s"))},
           "wire_s": max(r["wire_s"] for r in results)}
    if "same_bits" in got:  # the socket group: both schedules timed (sp_rank._schedules)
        got.update({key: statistics.mean(r[key] for r in results) for key in ("serial_wait_s", "overlap_wait_s")},
                   same_bits=all(r["same_bits"] for r in results))
    return got


def _overlap_lines(sps: list[dict]) -> list[str]:
    """Serial vs overlapped schedule (the socket group): forward seconds (the slower rank), the seconds a
    rank spends blocked in gathers (mean over ranks: the wire plus waiting for a slower peer), the share
    of that blocked time the overlap hides, and whether both schedules gave the same bits."""
    def spread(values: list[float], fmt: str) -> str:
        return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)} to {format(max(values), fmt)})"

    saved = [s["serial_forward_s"] - s["overlap_forward_s"] for s in sps]
    hidden = [1 - s["overlap_wait_s"] / s["serial_wait_s"] for s in sps]
    windows = {site: statistics.median(s["window_s"][site] for s in sps) for site in sps[0]["window_s"]}
    shares = {site: statistics.median(s["window_s"][site] / s["overlap_forward_s"] for s in sps) for site in windows}
    return [f"schedules: serial {spread([s['serial_forward_s'] for s in sps], '.3f')} s/step, overlapped "
            f"{spread([s['overlap_forward_s'] for s in sps], '.3f')} s/step, saved {spread(saved, '.3f')} s",
            f"  blocked in gathers per step: serial {spread([s['serial_wait_s'] for s in sps], '.4f')} s, overlapped "
            f"{spread([s['overlap_wait_s'] for s in sps], '.4f')} s: {spread(hidden, '.0%')} hidden; same bits: "
            f"{all(s['same_bits'] for s in sps)}",
            "  compute behind each gather per step (share of the forward; sp_plan.OVERLAP_SHARES): " + ", ".join(
                f"{site} K/V {t:.3f} s ({shares[site]:.1%}; {sps[0]['site_bytes'][site] / 1e6:.2f} MB)"
                for site, t in windows.items())]


def _full_size_lines(macs: int, chip: str) -> list[str]:
    """The full-size DiT (48 layers, 4096/2048 wide, bf16) on stage 1 of 1920x1088x121: 8,160 tokens, with
    the step model `farm bench model`'s simulation uses (sp_degree.gang_seconds: the audio / AdaLN part
    replicated, the rest split, the all-gathers over the link), then the whole render as that simulation
    runs it (stage 1's degree chosen at lease time)."""
    from coordinator.plan import costs, placement, sp_degree
    from farm_cli.bench.model import SPEC, _plan
    from ltx_engine.rules.sp_plan import TEXT_TOKENS, ShardPlan, forward_bytes

    tokens = 17 * 30 * 16
    forward = costs.dit_forward_s(tokens)
    one = forward / costs.chip_speed(chip)
    moved = forward_bytes(ShardPlan(tokens, macs), 48, 4096, 2048, 2, 128, TEXT_TOKENS)
    compute = (costs.DIT_FORWARD_S + (forward - costs.DIT_FORWARD_S) / macs) / costs.chip_speed(chip)
    lines = [f"full size, stage 1 of 1920x1088x121 ({tokens} tokens), {chip}: {one:.1f} s/step on one "
             f"(cost model); {macs} Macs receive {moved / 1e9:.2f} GB per step per rank"]
    tasks, slots, _ = _plan({**SPEC, "stage2_tiles": "2x2", "decode_tiles": "auto"}, macs, chip, 96, "p")
    for name, bw in LINKS:
        t = sp_degree.gang_seconds(forward, 1, tokens, macs, 1 / costs.chip_speed(chip), bw)
        wall = max(p.end for p in placement.simulate(tasks, [placement.Slot(**vars(s)) for s in slots],
                                                     sp=placement.SpRule(bw)))
        lines.append(f"  {name}: {compute:.1f} s compute + {t - compute:.1f} s of {moved / bw:.1f} s wire not hidden "
                     f"= {t:.1f} s/step, {one / t:.2f}x one Mac (audio and AdaLN replicated; sp_plan.OVERLAP_SHARES "
                     f"behind the gathers); the whole render {wall:.0f} s on {macs} (farm bench model)")
    return lines


def _projection(dit: str, t1: float, t2: float, wire2: float, tokens: int, macs: int) -> list[str]:
    from farm_cli.bench.sp_rank import TEXT_ROWS, dit_config
    from ltx_engine.rules.sp_plan import DitDims, ShardPlan, exposed_wire_s, site_bytes

    c = dit_config(dit)
    p = min(1.0, max(0.0, 2 * (1 - (t2 - wire2) / t1)))
    dims = DitDims.of(c, 4, TEXT_ROWS[dit])
    plan = ShardPlan(tokens, macs)
    moved = sum(site_bytes(plan, dims).values())
    lines = [f"projection, this DiT on {macs} Macs: parallel fraction p = {p:.3f} (from the 2-worker compute), "
             f"{moved / 1e6:.2f} MB per step per rank"]
    for name, bw in LINKS:
        compute = t1 * (1 - p) + t1 * p / macs
        t = compute + exposed_wire_s(plan, compute, bw, dims)
        lines.append(f"  {name}: {t:.2f} s/step vs {t1:.2f} s on one: {t1 / t:.2f}x "
                     f"({moved / bw:.4f} s wire, {t - compute:.4f} s not hidden)")
    return lines


def run(frames: int, height: int, width: int, pairs: int, repeats: int, macs: int, chip: str,
        group: str = "ring", dit: str = "tiny") -> None:
    if min(frames, height, width, pairs, repeats) < 1:
        raise typer.BadParameter("latent frames, height, width, --pairs and --repeats must be at least 1")
    grid = (frames, height, width)
    tokens = frames * height * width
    typer.echo(f"stage-1 forward, {dit} pack DiT layout, {tokens} video tokens + 126 audio, one core per worker; "
               f"{pairs} interleaved pairs of {repeats} timed forwards; the 2 workers' group: {group}")
    ones, sps, cpus = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-sp-") as tmp:
        for i in range(pairs):
            order = ("one", "sp") if i % 2 == 0 else ("sp", "one")
            got = {name: _one(dit, grid, repeats, Path(tmp)) if name == "one" else _sp(dit, grid, repeats, Path(tmp), group)
                   for name in order}
            ones.append(got["one"]["forward_s"])
            sps.append(got["sp"])
            cpus.append((got["one"]["cpu_s"], got["sp"]["cpu_s"]))
            typer.echo(f"pair {i + 1}: 1 worker {ones[-1]:.2f} s, 2 workers SP {sps[-1]['forward_s']:.2f} s "
                       f"(wire {sps[-1]['wire_s']:.3f} s), ratio {ones[-1] / sps[-1]['forward_s']:.2f}x; CPU "
                       f"{cpus[-1][0]:.2f} s vs {cpus[-1][1]:.2f} s on the busier rank: {cpus[-1][0] / cpus[-1][1]:.2f}x")
    ratios = [o / s["forward_s"] for o, s in zip(ones, sps, strict=True)]
    t1, t2 = statistics.median(ones), statistics.median(s["forward_s"] for s in sps)
    wire2 = statistics.median(s["wire_s"] for s in sps)
    moved = sps[0]["bytes_per_forward"]
    typer.echo(f"median: 1 worker {t1:.2f} s/step, 2 workers {t2:.2f} s/step, ratio {statistics.median(ratios):.2f}x "
               f"(pairs {min(ratios):.2f}-{max(ratios):.2f}); {moved / 1e6:.2f} MB per step per rank "
               f"(loopback: {wire2:.3f} s, {moved / max(wire2, 1e-9) / 1e9:.2f} GB/s)")
    c1, c2 = statistics.median(c for c, _ in cpus), statistics.median(c for _, c in cpus)
    typer.echo(f"median CPU per forward: 1 worker {c1:.2f} s, 2 workers {c2:.2f} s on the busier rank: {c1 / c2:.2f}x "
               "(on a loaded machine the CPU seconds are what each side costs; the wall adds the others' load)")
    if "same_bits" in sps[0]:
        for line in _overlap_lines(sps):
            typer.echo(line)
    for line in _projection(dit, t1, t2, wire2, tokens, macs) + _full_size_lines(macs, chip):
        typer.echo(line)
