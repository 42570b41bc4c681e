"""`farm bench overhead`: the farm's stage-2 time against the in-process run, and where it goes.

It renders the same tiled stage 2 in interleaved pairs — in this process (the
reference, tile by tile) and through a farm on this machine with one worker — and prints the median
stage-2 wall times, the median and spread of the per-pair raw ratio with its goal (<= 1.03), the forward
ratio (the worker's tile forwards, model loads left out, over the same forwards in-process: what a forward
shares the worker's process and cores with costs; goal <= 1.02), the mean tile-forward time (the ratios
are meaningful when a forward takes >= 0.5 s), the machine's load average before and after, and the bytes
that crossed the wire per denoising step.

The breakdown: from a farm render's events (task_leased / task_done, Redis clock, ms) the stage-2 wall time splits
into: the worker's tile forwards (its own compute seconds), moving the tile tensors (the worker's
fetch_s + upload_s), the coordinator's reducer tasks (cut, blend + sampler step), the rest of each
leased span (decode/encode, RPCs), and the gaps when no stage-2 task is leased at all (scheduling
latency: a ready task waiting to be leased). The in-process run has only forwards and reducer steps.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import typer

from farm_cli import common

PARTS = ("forward", "transfer", "reducer", "in-task other", "gaps")
RAW_GOAL, FORWARD_GOAL = 1.03, 1.02


def compute_seconds(metrics: list[dict]) -> float:
    """Summed forward seconds with model loads left out: a cold load on one side is not the forward's cost."""
    return sum(float(m.get("seconds") or 0.0) - float(m.get("load_s") or 0.0) for m in metrics)


def cpu_seconds(metrics: list[dict]) -> float:
    """Summed process CPU seconds during the forwards (the runner's `cpu_s`): in the worker it counts the
    helper threads that ran beside them too, and unlike wall time it holds still when other work loads
    the machine."""
    return sum(float(m.get("cpu_s") or 0.0) for m in metrics)


def _spans(events: list[dict], is_stage2) -> dict[str, tuple[float, float, dict]]:
    """task id -> (leased ms, done ms, task_done metrics) of the stage-2 tasks' last attempts."""
    leased: dict[str, float] = {}
    spans: dict[str, tuple[float, float, dict]] = {}
    for e in events:
        task = str(e.get("task"))
        if not is_stage2(task):
            continue
        if e.get("type") == "task_leased":
            leased[task] = float(e["ts"])
        elif e.get("type") == "task_done" and task in leased:
            spans[task] = (leased[task], float(e["ts"]), e.get("metrics") or {})
    return spans


def farm_breakdown(events: list[dict], is_stage2, reducer_worker: str = "coordinator") -> dict[str, float]:
    """Seconds per part of PARTS over one farm render's stage 2."""
    spans = _spans(events, is_stage2)
    workers = {e.get("task"): e.get("worker") for e in events if e.get("type") == "task_done"}
    out = dict.fromkeys(PARTS, 0.0)
    for task, (start, end, metrics) in spans.items():
        length = (end - start) / 1000.0
        if workers.get(task) == reducer_worker:
            out["reducer"] += length
            continue
        forward = float(metrics.get("seconds") or 0.0)
        transfer = float(metrics.get("fetch_s") or 0.0) + float(metrics.get("upload_s") or 0.0)
        out["forward"] += forward
        out["transfer"] += transfer
        out["in-task other"] += max(0.0, length - forward - transfer)
    covered, last = 0.0, None  # union of the leased spans; the rest of the wall is gaps
    for start, end, _ in sorted(spans.values()):
        if last is None or start >= last:
            covered += end - start
            last = end
        elif end > last:
            covered += end - last
            last = end
    if spans:
        wall = max(e for _, e, _ in spans.values()) - min(s for s, _, _ in spans.values())
        out["gaps"] = max(0.0, wall - covered) / 1000.0
    return out


def breakdown_lines(
    farm: list[dict[str, float]], local_forward: list[float], local_reducer: list[float]
) -> list[str]:
    """Median seconds per part, farm beside in-process."""
    med = statistics.median
    lines = [f"{'where stage 2 goes (s)':24}{'in-process':>12}{'farm (1 worker)':>18}"]
    local = {"forward": med(local_forward), "reducer": med(local_reducer)}
    for part in PARTS:
        mine = f"{local[part]:>12.3f}" if part in local else f"{'-':>12}"
        lines.append(f"{part:24}{mine}{med(f[part] for f in farm):>18.3f}")
    return lines


def _is_stage2(task_id: str) -> bool:
    return ".stage2" in task_id


def local_stage2_seconds(
    spec: dict, packs: Path, out: Path
) -> tuple[float, float, float, float, float, float]:
    """(stage-2 wall seconds, mean tile-forward seconds, summed forward seconds, reducer seconds, forward
    compute seconds, forward CPU seconds) of an in-process render."""
    from farm_cli.local import render_local
    from worker.runner import Runner

    marks: list[tuple[str, float, str]] = []
    forwards: list[float] = []
    metrics: list[dict] = []

    def on_event(event: dict) -> None:
        if event.get("type") == "task_done":
            marks.append((event["task"], time.perf_counter(), str(event.get("kind"))))
            if event.get("kind") == "transformer_forward":
                forwards.append(float(event.get("seconds", 0.0)))
                metrics.append(event)

    render_local(spec, out, Runner(packs), on_event=on_event)
    first = next(i for i, (tid, _, _) in enumerate(marks) if _is_stage2(tid))
    last = max(i for i, (tid, _, _) in enumerate(marks) if _is_stage2(tid))
    reducer = sum(
        marks[i][1] - marks[i - 1][1] for i in range(first, last + 1) if marks[i][2] != "transformer_forward"
    )
    return (
        marks[last][1] - marks[first - 1][1],
        sum(forwards) / max(1, len(forwards)),
        sum(forwards),
        reducer,
        compute_seconds(metrics),
        cpu_seconds(metrics),
    )


def farm_stage2_seconds(
    spec: dict, data: Path
) -> tuple[tuple[float, float, float, float], dict[int, int], dict[str, float]]:
    """((stage-2 wall seconds, mean tile-forward seconds, forward compute seconds, forward CPU seconds), bytes
    moved per step, where the time went) through a 1-worker farm."""
    from coordinator.state.blobs import BlobStore
    from farm_cli.client import FarmClient
    from farm_cli.services import local_farm

    with (
        local_farm(data, workers=1) as (address, token, _procs),
        FarmClient(address, token, timeout=60) as farm,
    ):
        render_id = farm.submit(dict(spec))
        events = list(farm.watch(render_id))
        render = farm.get(render_id)
    if render["state"] != "done":
        common.fail(f"bench render {render['state']}: {render.get('error')}", code=1)
    leased = [e["ts"] for e in events if e.get("type") == "task_leased" and _is_stage2(str(e.get("task")))]
    done = [e["ts"] for e in events if e.get("type") == "task_done" and _is_stage2(str(e.get("task")))]
    tiles = [t for t in render["tasks"] if t["kind"] == "transformer_forward"]
    blobs = BlobStore(data)
    moved: dict[int, int] = {}
    for t in tiles:
        shas = list((t.get("outputs") or {}).values()) + list((t.get("inputs") or {}).values())
        moved[t["params"]["step"]] = moved.get(t["params"]["step"], 0) + sum(
            blobs.size(s) for s in shas if blobs.has(s)
        )
    mean_forward = sum(t["metrics"]["seconds"] for t in tiles) / max(1, len(tiles))
    wall = (max(done) - min(leased)) / 1000.0
    return (
        (
            wall,
            mean_forward,
            compute_seconds([t["metrics"] for t in tiles]),
            cpu_seconds([t["metrics"] for t in tiles]),
        ),
        moved,
        farm_breakdown(events, _is_stage2),
    )


def _net(farm: tuple[float, ...], local: tuple[float, ...], where: dict[str, float]) -> float:
    """The farm's time beyond its own forwards, on the in-process forwards, over the in-process wall."""
    return (local[2] + farm[0] - where["forward"]) / local[0]


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} (spread {min(values):.3f}-{max(values):.3f})"


def _goal(value: float, goal: float) -> str:
    return f"goal <= {goal:.2f}: {'met' if value <= goal else 'NOT met'}"


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def _pair(spec: dict, folder: Path) -> tuple[tuple, tuple, dict[int, int], dict[str, float]]:
    """One in-process run then one farm run of the same stage 2, in a fresh data folder."""
    with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp:
        run_data = Path(tmp) / "data"
        run_data.mkdir()
        (run_data / "packs").symlink_to(folder / "packs", target_is_directory=True)
        local = local_stage2_seconds(spec, folder / "packs", Path(tmp) / "local.mp4")
        farm, moved, where = farm_stage2_seconds(spec, run_data)
    return local, farm, moved, where


def run(height: int, width: int, frames: int, tiles: str, pack: str, data: Path | None, pairs: int) -> None:
    """`farm bench overhead`: interleaved in-process / 1-worker-farm pairs of the same tiled stage 2."""
    from farm_cli.services import ensure_tiny_pack

    folder = common.data_dir(data)
    if pack == "tiny":
        ensure_tiny_pack(folder)
    # No audio track: its decode is last in the plan (after stage 2 in-process) but a lone farm worker may
    # take it while stage 2's cut runs, which would bill 2-3 s of audio decode to the farm's stage 2.
    spec = {
        "prompt": "a fox running through fresh snow",
        "height": height,
        "width": width,
        "frames": frames,
        "frame_rate": 24.0,
        "seed": 11,
        "pack": pack,
        "stage2_tiles": tiles,
        "tile_overlap": 5,
        "audio": False,
    }
    load_before = _load()
    local, farm, parts, moved = [], [], [], {}
    for pair in range(pairs):  # interleaved, so load on the machine hits both sides of a ratio alike
        lo, fa, moved, where = _pair(spec, folder)
        local.append(lo)
        farm.append(fa)
        parts.append(where)
        typer.echo(
            f"pair {pair + 1}: in-process {lo[0]:.3f} s, farm {fa[0]:.3f} s, raw ratio {fa[0] / lo[0]:.3f}, "
            f"forward ratio {fa[2] / lo[4]:.3f} (CPU {fa[3] / max(lo[5], 1e-9):.3f}), net {_net(fa, lo, where):.3f}",
            err=True,
        )
    raw = [f[0] / lo[0] for f, lo in zip(farm, local, strict=True)]
    forward = [f[2] / lo[4] for f, lo in zip(farm, local, strict=True)]
    cpu = [f[3] / lo[5] for f, lo in zip(farm, local, strict=True) if lo[5]]
    med = statistics.median
    typer.echo(f"stage 2, {tiles} tiles, {width}x{height}x{frames}, pack {pack}, {pairs} interleaved pairs")
    typer.echo(f"machine before: {load_before}; after: {_load()}")
    typer.echo(f"{'':24}{'in-process':>12}{'farm (1 worker)':>18}")
    typer.echo(
        f"{'stage-2 wall seconds':24}{med(x[0] for x in local):>12.3f}{med(x[0] for x in farm):>18.3f}"
    )
    typer.echo(f"{'mean tile forward s':24}{med(x[1] for x in local):>12.3f}{med(x[1] for x in farm):>18.3f}")
    typer.echo(f"forward ratio worker / in-process: {_spread(forward)}  {_goal(med(forward), FORWARD_GOAL)}")
    if cpu:  # what the worker's process burned during its forwards beyond the forwards themselves
        typer.echo(f"forward CPU ratio (process CPU seconds during the forwards): {_spread(cpu)}")
    typer.echo(
        f"raw ratio farm / in-process (stage-2 wall): {_spread(raw)}  {_goal(med(raw), RAW_GOAL)}"
        " (where a tile forward >= 0.5 s)"
    )
    # The same forwards (same code, same inputs) run at the machine's speed of the moment: on a loaded
    # machine their noise swamps a few per cent. Net of it: each side's time beyond its own forwards,
    # added to the in-process forwards.
    net = [_net(f, lo, w) for f, lo, w in zip(farm, local, parts, strict=True)]
    typer.echo(f"ratio net of forward-speed noise: {_spread(net)}")
    for line in breakdown_lines(parts, [x[2] for x in local], [x[3] for x in local]):
        typer.echo(line)
    for step, size in sorted(moved.items()):
        typer.echo(f"step {step}: {size / 2**20:.2f} MiB moved (tile inputs + outputs)")
