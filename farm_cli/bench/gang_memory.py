"""`farm bench gang-memory`: a gang member's peak RSS against the same worker running stage 1 alone.

Why: a gang rank runs inside its worker's process on the DiT the worker already holds (worker/gang.py),
where it used to be a child process that loaded the whole model again (a second copy on a 64 GB Mac
that already holds a warm DiT). The goal is a member's peak ≤ 1.1x the worker alone.

Each side is a fresh process playing a worker: it runs the tiny pack's stage-1 task alone once (its
last task: the DiT warm, as a worker's is), then either the same task alone again ("alone"), or its
rank 0 of a gang of 2 over `SocketGroup` on 127.0.0.1 ("gang"), the worker's own code path
(`gang.rank_of` + `Runner.run`, rank 0 keeping each step's states). Rank 1 is a fresh process that
loads the model and runs its rank with no task before: what the removed child process cost on top of
its worker, measured alongside. Peak RSS is the process's high-water mark (VmHWM / ru_maxrss). On the
tiny pack the weights are a sliver of the memory (activations and the runtime dominate), unlike a real
pack, so the weight bytes and the extra as a fraction of them are printed too. Sides alternate pair by
pair (load drifting on the machine hits both).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from farm_cli.bench.lowram import peak_rss
from protos.kinds import TaskKind

STAGE1 = TaskKind.DENOISE_STAGE1.value
GOAL = 1.1
TIMEOUT_S = 900
PACK = "tiny"


class _Captured(Exception):
    """Raised once stage 1's task is in hand: the render stops there (nothing after it is needed)."""


def _write_stage1(folder: Path, spec: dict) -> None:
    """The tiny pack, and the stage-1 task `farm render --local` plans for `spec` (params and inputs, as
    the tasks before it made them), written under `folder`."""
    from farm_cli.local import render_local
    from ltx_engine.tiny.tiny_pack import write_tiny_pack
    from worker.runner import Runner

    write_tiny_pack(folder / "packs" / PACK, seed=0)

    class Capture(Runner):
        def run(self, kind, params, inputs, progress=None, cancelled=None):
            if kind == STAGE1:
                plain = {k: v for k, v in params.items() if k not in ("stage1_parallel", "gang")}
                (folder / "params.json").write_text(json.dumps(plain))
                np.savez(folder / "inputs.npz", **inputs)
                raise _Captured
            return super().run(kind, params, inputs, progress, cancelled)

    try:
        render_local({**spec, "pack": PACK, "stage1_parallel": "1"}, folder / "unused.mp4", Capture(folder / "packs"))
    except _Captured:
        return
    raise RuntimeError("the plan has no stage-1 task")


def measure(side: str, folder: str, rank: str | None = None, hostfile: str | None = None) -> dict:
    """One process of a side: ("alone" | "gang" rank 0) after a warm-up task, or "gang" rank 1 cold."""
    from ltx_engine.parallel.sp_socket import SocketGroup
    from worker.gang import rank_of
    from worker.runner import Runner
    from worker.sp_stage import state_arrays

    root = Path(folder)
    runner = Runner(root / "packs")
    params = json.loads((root / "params.json").read_text())
    with np.load(root / "inputs.npz") as data:
        inputs = {k: data[k] for k in data.files}
    first = None if rank == "1" else runner.run(STAGE1, params, inputs)[0]  # the worker's last task
    warm = peak_rss()
    if side == "alone":
        out, metrics = runner.run(STAGE1, params, inputs)
    else:
        group = SocketGroup.open(int(rank), json.loads(Path(hostfile).read_text()), TIMEOUT_S)
        group.arm(TIMEOUT_S)
        kept: dict = {}

        def on_step(n: int, video, audio) -> None:
            group.arm(TIMEOUT_S)
            if rank == "0":
                kept["states"] = state_arrays(video, audio)  # what rank 0 keeps for a resume

        try:
            with rank_of(runner, group, on_step):
                out, metrics = runner.run(STAGE1, params, inputs)
        finally:
            group.close()
    same = first is None or all(np.array_equal(out[k], first[k]) for k in first)
    return {"side": side, "rank": rank, "peak_rss": peak_rss(), "warm_peak_rss": warm, "same": same,
            "weights_bytes": runner.engine.registry.loaded_bytes(), "seconds": metrics["seconds"]}


def _alone(folder: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "farm_cli.bench.gang_memory", "alone", str(folder)],
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    if out.returncode != 0:
        raise SystemExit(f"farm bench gang-memory: the alone side failed: {out.stderr.strip().splitlines()[-3:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _gang(folder: Path) -> list[dict]:
    from ltx_engine.parallel.sp_group import run_ring

    ranks = run_ring([sys.executable, "-m", "farm_cli.bench.gang_memory", "gang", str(folder)], 2, TIMEOUT_S)
    bad = [r for r in ranks if r.returncode != 0]
    if bad:
        raise SystemExit(f"farm bench gang-memory: rank {bad[0].rank} ended {bad[0].returncode}: "
                         f"{bad[0].output.strip().splitlines()[-3:]}")
    return [json.loads(r.output.strip().splitlines()[-1]) for r in ranks]


def run(spec: dict, pairs: int, as_json: bool) -> None:
    folder = Path(tempfile.mkdtemp(prefix="farm-bench-gang-memory-"))
    rows = []
    try:
        _write_stage1(folder, spec)
        for i in range(pairs):
            order = ("alone", "gang") if i % 2 == 0 else ("gang", "alone")
            got = {side: _alone(folder) if side == "alone" else _gang(folder) for side in order}
            if not (got["alone"]["same"] and all(r["same"] for r in got["gang"])):
                raise SystemExit("farm bench gang-memory: a rank's stage 1 differs from the plain one")
            rows.append(got)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    _report(spec, rows, as_json)


def _report(spec: dict, rows: list[dict], as_json: bool) -> None:
    alone = [r["alone"]["peak_rss"] for r in rows]
    member = [r["gang"][0]["peak_rss"] for r in rows]
    cold = [r["gang"][1]["peak_rss"] for r in rows]
    ratios = [m / a for m, a in zip(member, alone, strict=True)]
    weights = rows[0]["alone"]["weights_bytes"]
    extra = statistics.median(m - a for m, a in zip(member, alone, strict=True))
    report = {"size": f"{spec['width']}x{spec['height']}x{spec['frames']}", "pairs": len(rows),
              "alone_peak_rss": statistics.median(alone), "member_peak_rss": statistics.median(member),
              "peak_ratio": statistics.median(ratios), "peak_ratio_spread": [min(ratios), max(ratios)],
              "child_peak_rss": statistics.median(cold), "weights_bytes": weights, "extra_bytes": extra,
              "extra_to_weights": extra / weights if weights else None,
              "stage1_s": {"alone": statistics.median(r["alone"]["seconds"] for r in rows),
                           "gang": statistics.median(r["gang"][0]["seconds"] for r in rows)},
              "goal": GOAL}
    if as_json:
        print(json.dumps(report))
        return
    mib = 2**20
    print(f"tiny pack stage 1 at {report['size']}, {len(rows)} interleaved pairs (a fresh worker process per side); "
          f"weights held (its DiT) {weights / mib:.2f} MiB")
    print(f"peak RSS  worker alone {report['alone_peak_rss'] / mib:.0f} MiB, worker as gang rank 0 "
          f"{report['member_peak_rss'] / mib:.0f} MiB: ratio {report['peak_ratio']:.3f} "
          f"(spread {min(ratios):.3f}-{max(ratios):.3f}; goal <= {GOAL})")
    print(f"extra     {extra / mib:+.1f} MiB = {report['extra_to_weights'] or 0:.2f}x the weights "
          f"(the removed child process: {report['child_peak_rss'] / mib:.0f} MiB more on the same Mac, "
          f"its own copy of the weights included)")


if __name__ == "__main__":
    print(json.dumps(measure(*sys.argv[1:])))
