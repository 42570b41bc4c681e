"""`farm bench ...`: speed measured side by side in one run, never by timed assertions in tests.

Only the commands and their flags are here; each command imports its bench (farm_cli/bench/NAME.py)
when it runs, so `farm --help` and every other command never load them.
"""

from pathlib import Path
from typing import Annotated

import typer

from farm_cli import common
from farm_cli.render_options import spec_option

# The render flags a bench takes, from their spec fields (each bench gives its own default).
Height, Width, Frames = spec_option("height"), spec_option("width"), spec_option("frames", help="8k+1 frames.")
Stage2Tiles, Pack = spec_option("stage2_tiles"), spec_option("pack")
DecodeTiles = spec_option("decode_tiles")
Steps = spec_option("steps", help="Guided steps (LTX2 scheduler).")
DevPack = spec_option("pack", help="A pack with a dev DiT (tiny-dev: written if missing).")
BenchPack = spec_option("pack", help="bench: the tiny pack with a DiT that dominates a render (written into "
                        "DATA/packs/bench on first use); tiny, or any pack.")
Stage2Steps = spec_option("steps", help="Stage-2 steps (sigmas evenly from 0.909375 to 0).")
bench_app = typer.Typer(no_args_is_help=True, help="Side-by-side measurements.")


@bench_app.command("overhead")
def overhead(
    height: Height = 512,
    width: Width = 768,
    frames: Frames = 25,
    tiles: Stage2Tiles = "2x2",
    pack: Pack = "tiny",
    data: Annotated[Path | None, typer.Option("--data")] = None,
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved in-process/farm rounds.")] = 3,
) -> None:
    """Stage-2 wall time through the farm (1 worker) vs in-process, same tiles: paired raw and forward ratios; bytes per step."""
    from farm_cli.bench.overhead import run

    run(height, width, frames, tiles, pack, data, pairs)


@bench_app.command("guidance")
def guidance(
    height: Height = 512,
    width: Width = 768,
    frames: Frames = 49,
    steps: Steps = 4,
    pack: DevPack = "tiny-dev",
    data: Annotated[Path | None, typer.Option("--data")] = None,
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved 1-worker / 2-worker rounds.")] = 3,
) -> None:
    """A guided (CFG, 2 passes) step's wall time on 2 workers against 1: paired speed-up beside the ideal 2x."""
    from farm_cli.bench.guidance import run

    run(height, width, frames, steps, pack, data, pairs)


@bench_app.command("failover")
def failover(
    kills: Annotated[int, typer.Option("--kills", help="How many kill -9s (one render each).")] = 3,
    workers: Annotated[int, typer.Option("--workers")] = 3,
    data: Annotated[Path | None, typer.Option("--data")] = None,
) -> None:
    """Seconds from a worker's kill -9 to its task's next lease, per kill and the median."""
    from farm_cli.bench.failover import failover as run

    run(kills, workers, data)


@bench_app.command("silent")
def silent(
    mode: Annotated[str, typer.Option("--mode", help="stop: SIGSTOP the worker; drop: drop its packets "
                                      "(a network namespace and nft; root).")] = "stop",
    runs: Annotated[int, typer.Option("--runs", help="How many silences to measure.")] = 10,
    data: Annotated[Path | None, typer.Option("--data")] = None,
) -> None:
    """Seconds from a worker going silent (no TCP reset) to its task back in the queue: each, median, max."""
    from farm_cli.bench.silent import run

    run(mode, runs, data)


@bench_app.command("standby")
def standby(
    rounds: Annotated[int, typer.Option("--rounds", help="Rounds of four kills (stage 2, reducer, decode, "
                                        "assembling), three renders each.")] = 5,
    data: Annotated[Path | None, typer.Option("--data")] = None,
) -> None:
    """The Redis primary and the leading coordinator kill -9ed in every phase: kill to next lease, bit-identical."""
    from farm_cli.bench.standby import run

    run(rounds, data)


@bench_app.command("eta")
def eta(
    height: Height = 512,
    width: Width = 768,
    frames: Frames = 25,
    tiles: Stage2Tiles = "2x2",
    throttles: Annotated[str, typer.Option("--throttles", help="One worker per factor (1 = full speed).")] = "1,2,4",
    renders: Annotated[int, typer.Option("--renders", help="Measured renders after the warm-up.")] = 2,
    warmups: Annotated[int, typer.Option("--warmups", help="Renders the farm learns its speeds from first.")] = 2,
    pack: Pack = "tiny",
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
    tiles: Stage2Tiles = "auto",
) -> None:
    """Modelled speedup of N Macs over one Mac running the same plan, for a 1088x1920x121 render and a queue of
    them (cost model); then against one Mac on its own untiled plan."""
    from farm_cli.bench.model import model as run

    for line in run(macs, chip, memory_gb, queue, tiles):
        typer.echo(line)


@bench_app.command("scale")
def scale(
    height: Height = 384,
    width: Width = 512,
    frames: Frames = 25,
    tiles: Stage2Tiles = "2x2",
    decode_tiles: DecodeTiles = "80,256,320",
    workers: Annotated[int, typer.Option("--workers", help="Workers of the N side, one core each.")] = 2,
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved 1-worker / N-worker renders.")] = 3,
    queue: Annotated[int, typer.Option("--queue", help="Renders in the throughput case.")] = 4,
    queue_pairs: Annotated[int, typer.Option("--queue-pairs", help="Interleaved queue pairs (0: none).")] = 1,
    pack: BenchPack = "bench",
    cold: Annotated[bool, typer.Option("--cold", help="Fresh workers, their first imports and model loads timed "
                                       "(default: each farm first renders one small untimed render per worker).")] = False,
    data: Annotated[Path | None, typer.Option("--data")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON line (speedup, speedup_spread, queue_speedup, "
                                          "queue_speedup_spread, critical paths, stage-1 gangs, model).")] = False,
) -> None:
    """A whole render (text to mp4) on N workers vs 1, the same plan, each worker pinned to one core:
    paired speed-up, its critical path, a queue, and the cost model's prediction beside. The defaults
    (512x384x25, stage-2 tiles 2x2, decode tiles 80,256,320: 4 tiles, the bench pack) make the DiT the
    bulk of a render, as on a real pack, and split every stage that tiles; stage 1 asks for a gang of
    --workers, so it runs alone on 1 worker and ganged on N (the same task graph, the degree picked at
    lease time). A pair takes about 1.5 minutes on an idle 2-core Linux CPU, the whole default bench
    about 12."""
    from farm_cli.bench.scale import run

    if workers < 1 or pairs < 1 or queue < 1 or queue_pairs < 0:
        common.fail("--workers, --pairs and --queue must be at least 1, --queue-pairs at least 0")
    spec = {"prompt": "a fox running through fresh snow", "height": height, "width": width, "frames": frames,
            "frame_rate": 24.0, "pack": pack, "stage2_tiles": tiles, "decode_tiles": decode_tiles,
            "stage1_parallel": str(min(workers, 8))}  # gang up to N at lease time: 1 idle -> 1, N idle -> N
    run(spec, workers, pairs, queue, queue_pairs, data, as_json, warm=not cold)


@bench_app.command("dealing")
def dealing(
    height: Height = 512,
    width: Width = 768,
    frames: Frames = 17,
    tiles: Stage2Tiles = "2x5",
    steps: Stage2Steps = 3,
    throttles: Annotated[str, typer.Option("--throttles", help="One worker per factor (1 = full speed).")] = "1,2,4",
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved speed-aware/even pairs.")] = 3,
    pack: Pack = "tiny",
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
    pack: Pack = "tiny",
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
    height: Height = 1088,
    width: Width = 1920,
    frames: Frames = 121,
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


@bench_app.command("lowram")
def lowram(
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved resident/streamed rounds.")] = 3,
    gb: Annotated[float, typer.Option("--gb", help="GiB of seeded bf16 weights in the synthetic DiT.")] = 1.2,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object (peak_ratio, time_ratio, ...).")] = False,
) -> None:
    """Peak RSS and seconds of a DiT forward, resident vs block-streamed, on a synthetic transformer."""
    from farm_cli.bench.lowram import run
    from farm_cli.session import fail

    if pairs < 1 or not 0.01 <= gb <= 4:
        fail(f"bench lowram: --pairs {pairs} --gb {gb:g}: give at least 1 pair and 0.01-4 GiB")

    run(pairs, gb, as_json)


@bench_app.command("sp")
def sp(
    frames: Annotated[int, typer.Option("--latent-frames", help="Latent frames of the stage-1 grid.")] = 4,
    height: Annotated[int, typer.Option("--latent-height")] = 16,
    width: Annotated[int, typer.Option("--latent-width")] = 32,
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved 1-worker / 2-worker SP pairs.")] = 3,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed forwards per side per pair.")] = 2,
    macs: Annotated[int, typer.Option("--macs", help="Macs in the projection.")] = 4,
    chip: Annotated[str, typer.Option("--chip", help="Chip of the full-size projection.")] = "M1 Max",
    group: Annotated[str, typer.Option("--group", help="ring (mx.distributed) or socket (a gang's SocketGroup).")]
    = "ring",
    dit: Annotated[str, typer.Option("--dit", help="tiny or bench: the DiT of `farm pack tiny --dit` (bench: 1024 "
                                                   "text rows, as its pack's contexts).")] = "tiny",
) -> None:
    """Stage-1 DiT forward sequence-parallel on 2 workers vs 1 (a group on 127.0.0.1), bytes per step, ratio,
    and a projection for N Macs over 10 GbE and Thunderbolt 5."""
    from farm_cli.bench.sp import run
    from farm_cli.session import fail

    if group not in ("ring", "socket"):
        fail(f"bench sp: --group {group}: give ring or socket")
    if dit not in ("tiny", "bench"):
        fail(f"bench sp: --dit {dit}: give tiny or bench")
    run(frames, height, width, pairs, repeats, macs, chip, group, dit)


@bench_app.command("gang-memory")
def gang_memory(
    height: Height = 384,
    width: Width = 576,
    frames: Frames = 25,
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved alone / gang rounds.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object (peak_ratio, extra_bytes, ...).")] = False,
) -> None:
    """Peak RSS of a worker running its gang rank's stage 1 (in its own process, on its loaded DiT) vs the
    same worker running that stage 1 alone, on the tiny pack; the weight bytes and the extra's share of them."""
    from farm_cli.bench.gang_memory import run
    from farm_cli.session import fail

    if pairs < 1:
        fail(f"bench gang-memory: --pairs {pairs}: give at least 1")
    run({"prompt": "a fox", "height": height, "width": width, "frames": frames, "seed": 3}, pairs, as_json)


@bench_app.command("sparse")
def sparse(
    tokens: Annotated[str, typer.Option("--tokens", help="Token counts, multiples of 1024.")] = "8192,16384,32768",
    tau: Annotated[float, typer.Option("--tau", help="The routing threshold's tau.")] = 1.0,
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved dense/sparse pairs.")] = 2,
    layers: Annotated[int, typer.Option("--layers", help="DiT blocks of the whole forward (block 0 dense).")] = 4,
    forward_max: Annotated[int, typer.Option("--forward-max", help="Whole forwards only up to this many tokens.")]
    = 32768,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Sparse stage-2 attention vs dense: one attention call and a whole forward per token count."""
    from farm_cli.bench.sparse import run

    run([int(x) for x in tokens.split(",")], tau, pairs, layers, forward_max, as_json)


@bench_app.command("step-cache")
def step_cache(
    height: Height = 256,
    width: Width = 256,
    frames: Frames = 17,
    stage1_steps: Steps = 12,
    stage2_steps: spec_option("stage2_steps") = 3,
    pack: DevPack = "tiny-dev",
    thresholds: Annotated[str, typer.Option("--thresholds", help="Two (or more) --step-cache thresholds.")] = "0.5,1.0",
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved uncached/cached rounds.")] = 3,
    data: Annotated[Path | None, typer.Option("--data")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """A guided two-stage render with --step-cache vs uncached (--local): paired speed-ups and PSNR per threshold."""
    from farm_cli.bench.step_cache import run

    run(height, width, frames, stage1_steps, stage2_steps, pack, [float(t) for t in thresholds.split(",")], pairs,
        data, as_json)


@bench_app.command("relay")
def relay(
    height: Height = 512,
    width: Width = 768,
    frames: Frames = 121,
    frame_rate: spec_option("frame_rate") = 24.0,
    layers: Annotated[int, typer.Option("--layers", help="DiT blocks of the tiny-width forward.")] = 4,
    pairs: Annotated[int, typer.Option("--pairs", help="Interleaved without/with-segments pairs.")] = 5,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Prompt Relay's mask (--segment) per stage: its build, a forward and a full-width text attention with and
    without it (paired medians), and the full-size stage's extra seconds."""
    from farm_cli.bench.relay import run

    run(height, width, frames, frame_rate, layers, pairs, as_json)
