"""`farm bench ...`: speed measured side by side in one run, never by timed assertions in tests.

`farm bench overhead` renders the same tiled stage 2 in interleaved pairs — in this process (the
reference, tile by tile) and through a farm on this machine with one worker — and prints the median
stage-2 wall times, the median and spread of the per-pair ratio with the goal, the mean tile-forward time (the ratio is meaningful when a forward takes >= 0.5 s) and the
bytes that crossed the wire per denoising step.
"""

import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from farm_cli import common

bench_app = typer.Typer(no_args_is_help=True, help="Side-by-side measurements.")


def _is_stage2(task_id: str) -> bool:
    return ".stage2" in task_id


def local_stage2_seconds(spec: dict, packs: Path, out: Path) -> tuple[float, float, float, float]:
    """(stage-2 wall seconds, mean tile-forward seconds, summed forward seconds, reducer seconds) of an
    in-process render."""
    from farm_cli.local import render_local
    from worker.runner import Runner

    marks: list[tuple[str, float, str]] = []
    forwards: list[float] = []

    def on_event(event: dict) -> None:
        if event.get("type") == "task_done":
            marks.append((event["task"], time.perf_counter(), str(event.get("kind"))))
            if event.get("kind") == "transformer_forward":
                forwards.append(float(event.get("seconds", 0.0)))

    render_local(spec, out, Runner(packs), on_event=on_event)
    first = next(i for i, (tid, _, _) in enumerate(marks) if _is_stage2(tid))
    last = max(i for i, (tid, _, _) in enumerate(marks) if _is_stage2(tid))
    reducer = sum(marks[i][1] - marks[i - 1][1] for i in range(first, last + 1)
                  if marks[i][2] != "transformer_forward")
    return (marks[last][1] - marks[first - 1][1], sum(forwards) / max(1, len(forwards)), sum(forwards),
            reducer)


def farm_stage2_seconds(spec: dict, data: Path) -> tuple[float, float, dict[int, int], dict[str, float]]:
    """(stage-2 wall seconds, mean tile-forward seconds, bytes moved per step, where the time went) through
    a 1-worker farm."""
    from coordinator.state.blobs import BlobStore
    from farm_cli.bench.overhead import farm_breakdown
    from farm_cli.client import FarmClient
    from farm_cli.services import local_farm

    with local_farm(data, workers=1) as (address, token, _procs), FarmClient(address, token, timeout=60) as farm:
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
        moved[t["params"]["step"]] = moved.get(t["params"]["step"], 0) + sum(blobs.size(s) for s in shas if blobs.has(s))
    mean_forward = sum(t["metrics"]["seconds"] for t in tiles) / max(1, len(tiles))
    return (max(done) - min(leased)) / 1000.0, mean_forward, moved, farm_breakdown(events, _is_stage2)


def _net(farm: tuple[float, float], local: tuple[float, float, float, float], where: dict[str, float]) -> float:
    """The farm's time beyond its own forwards, on the in-process forwards, over the in-process wall."""
    return (local[2] + farm[0] - where["forward"]) / local[0]


@bench_app.command("overhead")
def overhead(
    height: Annotated[int, typer.Option("-H", "--height")] = 512,
    width: Annotated[int, typer.Option("-W", "--width")] = 768,
    frames: Annotated[int, typer.Option("-f", "--frames")] = 25,
    tiles: Annotated[str, typer.Option("--stage2-tiles")] = "2x2",
    pack: Annotated[str, typer.Option("--pack")] = "tiny",
    data: Annotated[Path | None, typer.Option("--data")] = None,
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved in-process/farm rounds.")] = 3,
) -> None:
    """Stage-2 wall time through the farm (1 worker) vs in-process, same tiles: paired ratio; bytes per step."""
    from farm_cli.bench.overhead import breakdown_lines
    from farm_cli.services import ensure_tiny_pack

    folder = common.data_dir(data)
    if pack == "tiny":
        ensure_tiny_pack(folder)
    # No audio track: its decode is last in the plan (after stage 2 in-process) but a lone farm worker may
    # take it while stage 2's cut runs, which would bill 2-3 s of audio decode to the farm's stage 2.
    spec = {"prompt": "a fox running through fresh snow", "height": height, "width": width, "frames": frames,
            "frame_rate": 24.0, "seed": 11, "pack": pack, "stage2_tiles": tiles, "tile_overlap": 5, "audio": False}
    local, farm, parts = [], [], []
    for pair in range(pairs):  # interleaved, so load on the machine hits both sides of a ratio alike
        with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp:
            run_data = Path(tmp) / "data"
            run_data.mkdir()
            (run_data / "packs").symlink_to(folder / "packs", target_is_directory=True)
            local.append(local_stage2_seconds(spec, folder / "packs", Path(tmp) / "local.mp4"))
            farm_s, farm_fwd, moved, where = farm_stage2_seconds(spec, run_data)
            farm.append((farm_s, farm_fwd))
            parts.append(where)
        typer.echo(f"pair {pair + 1}: in-process {local[-1][0]:.3f} s, farm {farm_s:.3f} s, "
                   f"ratio {farm_s / local[-1][0]:.3f}, net {_net(farm[-1], local[-1], where):.3f}", err=True)
    ratios = [f[0] / lo[0] for f, lo in zip(farm, local, strict=True)]
    med = statistics.median
    typer.echo(f"stage 2, {tiles} tiles, {width}x{height}x{frames}, pack {pack}, {pairs} interleaved pairs")
    typer.echo(f"{'':24}{'in-process':>12}{'farm (1 worker)':>18}")
    typer.echo(f"{'stage-2 wall seconds':24}{med(x[0] for x in local):>12.3f}{med(x[0] for x in farm):>18.3f}")
    typer.echo(f"{'mean tile forward s':24}{med(x[1] for x in local):>12.3f}{med(x[1] for x in farm):>18.3f}")
    typer.echo(f"ratio farm / in-process: median {med(ratios):.3f} (spread {min(ratios):.3f}-{max(ratios):.3f})  "
               f"goal <= 1.03 where a tile forward >= 0.5 s: {'met' if med(ratios) <= 1.03 else 'NOT met'}")
    # The same forwards (same code, same inputs) run at the machine's speed of the moment: on a loaded
    # machine their noise swamps a few per cent. Net of it: each side's time beyond its own forwards,
    # added to the in-process forwards.
    net = [_net(f, lo, w) for f, lo, w in zip(farm, local, parts, strict=True)]
    typer.echo(f"ratio net of forward-speed noise: median {med(net):.3f} (spread {min(net):.3f}-{max(net):.3f})")
    for line in breakdown_lines(parts, [x[2] for x in local], [x[3] for x in local]):
        typer.echo(line)
    for step, size in sorted(moved.items()):
        typer.echo(f"step {step}: {size / 2**20:.2f} MiB moved (tile inputs + outputs)")


@bench_app.command("failover")
def failover(
    kills: Annotated[int, typer.Option("--kills", help="How many kill -9s (one render each).")] = 3,
    workers: Annotated[int, typer.Option("--workers")] = 3,
    data: Annotated[Path | None, typer.Option("--data")] = None,
) -> None:
    """Seconds from a worker's kill -9 to its task's next lease, per kill and the median."""
    from farm_cli.bench.failover import failover as run

    run(kills, workers, data)


@bench_app.command("eta")
def eta(
    height: Annotated[int, typer.Option("-H", "--height")] = 512,
    width: Annotated[int, typer.Option("-W", "--width")] = 768,
    frames: Annotated[int, typer.Option("-f", "--frames")] = 25,
    tiles: Annotated[str, typer.Option("--stage2-tiles")] = "2x2",
    throttles: Annotated[str, typer.Option("--throttles", help="One worker per factor (1 = full speed).")] = "1,2,4",
    renders: Annotated[int, typer.Option("--renders", help="Measured renders after the warm-up.")] = 2,
    warmups: Annotated[int, typer.Option("--warmups", help="Renders the farm learns its speeds from first.")] = 2,
    pack: Annotated[str, typer.Option("--pack")] = "tiny",
    data: Annotated[Path | None, typer.Option("--data")] = None,
) -> None:
    """ETA vs the real remaining time on a throttled fleet, from 25 % progress on (goal: within 20 %)."""
    from farm_cli.bench.eta import run

    spec = {"prompt": "a fox running through fresh snow", "height": height, "width": width, "frames": frames,
            "frame_rate": 24.0, "pack": pack, "stage2_tiles": tiles, "tile_overlap": 5}
    run(spec, [float(t) for t in throttles.split(",")], renders, data, warmups)


@bench_app.command("model")
def model(
    macs: Annotated[int, typer.Option("--macs")] = 4,
    chip: Annotated[str, typer.Option("--chip", help="A chip of coordinator/plan/costs.py's table.")] = "M1 Max",
    memory_gb: Annotated[float, typer.Option("--memory-gb")] = 96.0,
    queue: Annotated[int, typer.Option("--queue", help="Renders in the throughput case.")] = 8,
    tiles: Annotated[str, typer.Option("--stage2-tiles")] = "2x2",
) -> None:
    """Modelled speedup of N Macs over one for a 1088x1920x121 render and a queue of them (cost model)."""
    from farm_cli.bench.model import model as run

    for line in run(macs, chip, memory_gb, queue, tiles):
        typer.echo(line)


@bench_app.command("dealing")
def dealing(
    height: Annotated[int, typer.Option("-H", "--height")] = 512,
    width: Annotated[int, typer.Option("-W", "--width")] = 768,
    frames: Annotated[int, typer.Option("-f", "--frames")] = 17,
    tiles: Annotated[str, typer.Option("--stage2-tiles")] = "2x5",
    steps: Annotated[int, typer.Option("--steps", help="Stage-2 steps (sigmas evenly from 0.909375 to 0).")] = 3,
    throttles: Annotated[str, typer.Option("--throttles", help="One worker per factor (1 = full speed).")] = "1,2,4",
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved speed-aware/even pairs.")] = 3,
    pack: Annotated[str, typer.Option("--pack")] = "tiny",
    data: Annotated[Path | None, typer.Option("--data")] = None,
) -> None:
    """Stage-2 step time with speed-aware vs even tile dealing on a throttled fleet (goals: beats even,
    within 15 % of the ideal speed-weighted split)."""
    from farm_cli.bench.dealing import run

    sigmas = [round(0.909375 * (1 - i / steps), 6) for i in range(steps)] + [0.0]
    spec = {"prompt": "a fox running through fresh snow", "height": height, "width": width, "frames": frames,
            "frame_rate": 24.0, "pack": pack, "stage2_tiles": tiles, "tile_overlap": 2, "stage2_sigmas": sigmas,
            "audio": False}
    run(spec, [float(t) for t in throttles.split(",")], pairs, data)


@bench_app.command("affinity")
def affinity(
    renders: Annotated[int, typer.Option("--renders", help="Renders queued at once per side.")] = 6,
    workers: Annotated[int, typer.Option("--workers")] = 2,
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved affinity on/off pairs.")] = 2,
    budget_mb: Annotated[float, typer.Option("--model-budget-mb", help="Each worker's warm-model memory.")] = 3.0,
    pack: Annotated[str, typer.Option("--pack")] = "tiny",
    data: Annotated[Path | None, typer.Option("--data")] = None,
) -> None:
    """Model loads of a mixed queue with warm-model affinity on vs off (the coordinator's policy), paired."""
    from farm_cli.bench.affinity import run

    spec = {"prompt": "a fox in snow", "height": 256, "width": 384, "frames": 9, "frame_rate": 24.0, "pack": pack}
    run(spec, workers, renders, pairs, budget_mb, data)


@bench_app.command("transfer")
@bench_app.command("blobs", hidden=True)
def transfer(
    mib: Annotated[int, typer.Option("--mib", help="Blob size in MiB.")] = 256,
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved put/raw/get/raw rounds.")] = 5,
    data: Annotated[Path | None, typer.Option("--data", help="Folder for the bench's temp data.")] = None,
) -> None:
    """Blob put/get GB/s through a real coordinator vs raw TCP loopback: paired median and spread."""
    from farm_cli.bench.transfer import transfer as run

    run(mib, pairs, data)


@bench_app.command("assembly")
def assembly(
    height: Annotated[int, typer.Option("-H", "--height")] = 1088,
    width: Annotated[int, typer.Option("-W", "--width")] = 1920,
    frames: Annotated[int, typer.Option("-f", "--frames")] = 121,
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved before/now rounds.")] = 2,
    encode: Annotated[bool, typer.Option("--encode/--no-encode", help="Also encode the mp4.")] = False,
    data: Annotated[Path | None, typer.Option("--data", help="Folder for the synthetic tile blobs.")] = None,
) -> None:
    """Coordinator peak RSS of a tiled decode assembly (synthetic tiles of the real sizes), before vs now."""
    from farm_cli.bench.assembly import assembly as run

    run(height, width, frames, pairs, encode, data)


@bench_app.command("transitions")
@bench_app.command("scheduler", hidden=True)
def transitions(
    workers: Annotated[int, typer.Option("--workers", help="Simulated workers (threads).")] = 50,
    tasks: Annotated[int, typer.Option("--tasks", help="Tasks per side per pair.")] = 2000,
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved store/gRPC rounds.")] = 3,
    data: Annotated[Path | None, typer.Option("--data", help="Folder for the bench's Redis and data.")] = None,
    profile: Annotated[bool, typer.Option("--profile", help="Sample the coordinator's stacks (last round).")] = False,
) -> None:
    """Lease→complete transitions/s with N simulated workers: the store's Lua alone vs over gRPC, paired."""
    from farm_cli.bench.transitions import transitions as run

    run(workers, tasks, pairs, data, profile)


@bench_app.command("watchers")
def watchers(
    count: Annotated[int, typer.Option("--watchers", help="Concurrent Watch streams on the crowd side.")] = 500,
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved quiet/crowd rounds.")] = 3,
    workers: Annotated[int, typer.Option("--workers", help="Local worker processes.")] = 2,
    data: Annotated[Path | None, typer.Option("--data", help="Folder for the bench's farm.")] = None,
) -> None:
    """Worker RPC p99 during a tiled render with N watchers vs none: paired ratio, goal within 2x."""
    from farm_cli.bench.watchers import watchers_bench

    if count < 1 or pairs < 1 or workers < 1:
        common.fail("--watchers, --pairs and --workers must be at least 1")
    watchers_bench(count, pairs, workers, data)
