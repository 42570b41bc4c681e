"""`farm bench scale`: a whole render (text to mp4) on N workers against 1 worker, the same plan.

Why: the farm's promise is speed from more Macs; this measures it end to end on this machine. Each
side is a fresh farm (embedded Redis and the coordinator in this process) with worker processes each
pinned to one core (sched_setaffinity, inherited by every thread and child, and one BLAS/OpenMP
thread), so 1 worker is one core and N workers are N cores: the same compute per worker. Pairs run
interleaved (1 worker, then N, repeated) so a drift in the machine's load falls on both sides. The
wall time runs from the first submit to the last render finished (Redis clock); its critical path
(farm_cli/bench/critical.py) names where it went. A queue of renders (1 worker vs N) shows throughput.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import typer

from coordinator.plan import placement
from farm_cli import common
from farm_cli.bench import critical
from protos.states import TERMINAL

ONE_CORE = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "VECLIB_MAXIMUM_THREADS": "1"}
START_TIMEOUT_S = 120
GOALS = {"speedup": 1.8, "queue_speedup": 1.9, "model_error": 0.15}  # 2 workers vs 1; model vs measured


@dataclass
class Run:
    """One measured side: its wall seconds, critical path, tasks (for the model) and pinning check."""

    workers: int
    renders: int
    wall_s: float
    path: list[critical.Segment]
    tasks: list[dict]
    pinning: dict = field(default_factory=dict)


def spawn_pinned(address: str, data: Path, count: int) -> list[subprocess.Popen]:
    """`count` worker processes, worker i pinned to core i (mod the cores; `taskset`, where there is
    one) with one BLAS/OpenMP thread."""
    from farm_cli.services import worker_command

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    taskset = shutil.which("taskset")
    procs = []
    for i in range(count):
        cmd = worker_command(address, data / "token", data / "packs", f"w{i + 1}", data / f"cache-{i + 1}",
                             wait_ms=500)
        if taskset:
            cmd = [taskset, "-c", str(cores[i % len(cores)]), *cmd]
        log = open(data / f"worker-{i + 1}.log", "ab")  # noqa: SIM115 - the child keeps it
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **ONE_CORE}))
    return procs


def _wait_workers(store, count: int) -> None:
    """Until `count` workers are registered and idle (their start is not the render's time)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if sum(w.get("state") == "idle" for w in store.list_workers()) >= count:
            return
        time.sleep(0.2)
    common.fail(f"bench scale: {count} workers did not register in {START_TIMEOUT_S} s", code=1)


def _wait_renders(store, ids: list[str], timeout_s: float = 3600) -> list[dict]:
    """Each render's row once every one has ended; a render that does not end done fails the bench."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = [store.get_render(r) or {} for r in ids]
        if all(r.get("state") in TERMINAL for r in rows):
            bad = [r for r in rows if r.get("state") != "done"]
            if bad:
                common.fail(f"bench render {bad[0].get('id')} {bad[0].get('state')}: {bad[0].get('error')}", code=1)
            return rows
        time.sleep(0.2)
    common.fail(f"bench scale: renders did not end in {timeout_s:.0f} s", code=1)
    raise AssertionError  # unreachable: fail exits


def warm_spec(spec: dict, index: int) -> dict:
    """A small render of `spec`'s recipe and pack that touches every model the measured render runs (text,
    DiT, upsampler, VAE, audio): a farm that has been up holds them warm, so a warm-up of these leaves each
    worker as a farm between renders would (imports paid, weights resident) for a fraction of the time. Its
    own prompt (one per warm-up render): the prompt-embedding cache must not hand the measured render its
    text, and each render's text encode can go to another worker."""
    return {**spec, "prompt": f"warm-up {index}: a lamp on a table", "height": 128, "width": 256, "frames": 9,
            "stage2_tiles": "1x2", "decode_tiles": "auto", "seed": 0}


def measure(spec: dict, workers: int, renders: int, packs: Path, warm: bool = False) -> Run:
    """`renders` renders of `spec` (seeds 1..renders, submitted at once) on a fresh farm of `workers`
    pinned workers: the wall time, its critical path, the tasks and the pinning seen. `warm`: the farm
    first renders `workers` small warm-up renders at once (one per worker, untimed: `warm_spec`), so the
    measured renders meet warm workers, as on a farm that has been up."""
    from farm_cli.bench.dealing import policy_farm
    from farm_cli.client import FarmClient
    from farm_cli.services import _stop_processes

    with tempfile.TemporaryDirectory(prefix="farm-bench-scale-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        (data / "packs").symlink_to(packs, target_is_directory=True)
        with policy_farm(data) as (address, token, store):
            procs = spawn_pinned(address, data, workers)
            try:
                _wait_workers(store, workers)
                if warm:
                    with FarmClient(address, token, timeout=60) as farm:
                        _wait_renders(store, [farm.submit(warm_spec(spec, i)) for i in range(workers)])
                    _wait_workers(store, workers)
                cpu0, t0 = [_cpu_s(p.pid) for p in procs], time.monotonic()
                with FarmClient(address, token, timeout=60) as farm:
                    ids = [farm.submit({**spec, "seed": i + 1}) for i in range(renders)]
                    rows = _wait_renders(store, ids)
                seconds = time.monotonic() - t0
                pinning = {"allowed": ["|".join(sorted(_allowed(p.pid))) for p in procs],
                           "cores_used": [round((_cpu_s(p.pid) - c) / seconds, 2) for p, c in zip(procs, cpu0, strict=True)]}
                tasks = [t for r in ids for t in store.render_tasks(r)]
            finally:
                _stop_processes(procs)
    start, end = min(int(r["created_ms"]) for r in rows), max(int(r["finished_ms"]) for r in rows)
    return Run(workers, renders, (end - start) / 1000.0, critical.critical_path(tasks, start, end), tasks, pinning)


def _allowed(pid: int) -> set[str]:
    """The CPU lists the threads of `pid` may run on (one list when the pinning holds for all)."""
    out = set()
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    out.add(line.split(":", 1)[1].strip())
        except OSError:  # a thread that ended meanwhile
            continue
    return out


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of `pid` and its waited-for children so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _ratios(pairs: list[tuple[Run, Run]]) -> list[float]:
    return [a.wall_s / b.wall_s for a, b in pairs]


def _median_pair(pairs: list[tuple[Run, Run]]) -> tuple[Run, Run]:
    """The pair whose speed-up is the median (the lower middle one of an even count)."""
    ranked = sorted(pairs, key=lambda p: p[0].wall_s / p[1].wall_s)
    return ranked[(len(ranked) - 1) // 2]


def gangs(tasks: list[dict]) -> list[int]:
    """The degree each stage-1 task ran at (its metrics' `stage1_parallel`: the gang's size, 1 alone)."""
    return [int((t.get("metrics") or {}).get("stage1_parallel") or 1) for t in tasks if t.get("kind") == "denoise_stage1"]


def _side(run: Run) -> dict:
    return {"wall_s": round(run.wall_s, 3), "parts": critical.by_part(run.path), "stages": critical.by_stage(run.path),
            "path_sum_s": round(sum(s.seconds for s in run.path), 3), "pinning": run.pinning,
            "stage1_gangs": gangs(run.tasks)}


def _block(pairs: list[tuple[Run, Run]], workers: int, sp: placement.SpRule) -> dict:
    """Speed-up median and spread, both sides' walls, the median pair's critical paths and the model."""
    from farm_cli.bench.scale_model import model_vs_measured

    ratios = _ratios(pairs)
    one, many = _median_pair(pairs)
    model = model_vs_measured(one.tasks, many.tasks, workers, sp, critical.by_part(one.path)["assembly"])
    measured = one.wall_s / many.wall_s
    model["error"] = round(model["speedup"] / measured - 1, 3)
    model["wall_error"] = round(model["many_s"] / many.wall_s - 1, 3)
    return {"speedup": round(statistics.median(ratios), 3), "spread": [round(min(ratios), 3), round(max(ratios), 3)],
            "one_worker_s": [round(a.wall_s, 3) for a, _ in pairs], "workers_s": [round(b.wall_s, 3) for _, b in pairs],
            "critical_path": {"one": _side(one), "many": _side(many)}, "model": model,
            "slowdown": critical.slowdown(one.tasks, many.tasks)}


def measure_pairs(spec: dict, workers: int, renders: int, pairs: int, packs: Path,
                  warm: bool = False) -> list[tuple[Run, Run]]:
    """`pairs` interleaved (1 worker, `workers` workers) runs of `renders` renders each."""
    out = []
    for i in range(pairs):
        one = measure(spec, 1, renders, packs, warm)
        many = measure(spec, workers, renders, packs, warm)
        out.append((one, many))
        typer.echo(f"{renders} render(s), pair {i + 1}: 1 worker {one.wall_s:.1f} s, {workers} workers "
                        f"{many.wall_s:.1f} s, speed-up {one.wall_s / many.wall_s:.2f}x", err=True)
    return out


def scale(spec: dict, workers: int, pairs: int, queue: int, queue_pairs: int, packs: Path, warm: bool = False) -> dict:
    """The whole bench as one JSON-able dict: one render in `pairs` pairs, a queue in `queue_pairs`;
    `warm`: each farm renders warm-up renders first (`measure`)."""
    load_before = os.getloadavg()
    sp = gang_rule(packs / spec["pack"])
    single = _block(measure_pairs(spec, workers, 1, pairs, packs, warm), workers, sp)
    queued = _block(measure_pairs(spec, workers, queue, queue_pairs, packs, warm), workers, sp) if queue_pairs else None
    return {"spec": {k: spec[k] for k in ("width", "height", "frames", "stage2_tiles", "decode_tiles", "pack")}, "workers": workers,
            "warm": warm,
            "pairs": pairs, "speedup": single["speedup"], "speedup_spread": single["spread"],
            "queue_renders": queue, "queue_pairs": queue_pairs,
            "queue_speedup": queued["speedup"] if queued else None,
            "queue_speedup_spread": queued["spread"] if queued else None,
            "one": single, "queue": queued, "goals": GOALS, "cores": os.cpu_count(),
            "model_gang": {"link_bytes_per_s": round(sp.link_bytes_per_s), "dit": asdict(sp.dims)},
            "load": [round(x, 2) for x in (*load_before, *os.getloadavg())]}


def loopback_bytes_per_s(payload_mib: int = 64, repeats: int = 3) -> float:
    """This machine's TCP throughput over 127.0.0.1, the link a gang's ranks use here (the median of
    `repeats` sends of `payload_mib` MiB): the model's gang is priced over it, not over 10 GbE."""
    chunk = bytes(1 << 20)
    rates = []
    for _ in range(repeats):
        server = socket.create_server(("127.0.0.1", 0))
        sender = threading.Thread(target=_send, args=(server.getsockname(), chunk, payload_mib), daemon=True)
        start = time.perf_counter()
        sender.start()
        conn, _ = server.accept()
        got, buf = 0, bytearray(1 << 20)
        while got < payload_mib << 20 and (n := conn.recv_into(buf)):
            got += n
        rates.append(got / (time.perf_counter() - start))
        sender.join()
        conn.close()
        server.close()
    return statistics.median(rates)


def _send(address: tuple, chunk: bytes, count: int) -> None:
    with socket.create_connection(address) as sock:
        for _ in range(count):
            sock.sendall(chunk)


def gang_rule(pack: Path) -> placement.SpRule:
    """The model's gang for this bench: the pack's DiT (float32 activations on the CPU backend) over this
    machine's loopback; a stage-1 task without a request runs alone, as in the farm's ETA."""
    from ltx_engine.loading.pack import open_pack
    from ltx_engine.rules.sp_plan import DitDims

    dims = DitDims.of(open_pack(pack).config["transformer"], itemsize=4)
    return placement.SpRule(loopback_bytes_per_s(), default=1, dims=dims)


def _path_lines(name: str, side: dict) -> list[str]:
    parts = ", ".join(f"{k} {v:.1f}" for k, v in side["parts"].items() if v >= 0.05)
    stages = ", ".join(f"{k} {v:.1f}" for k, v in side["stages"].items())
    return [f"    {name}: wall {side['wall_s']:.1f} s = path {side['path_sum_s']:.1f} s: {parts}",
            f"      by stage: {stages}"]


def _block_lines(title: str, block: dict, workers: int, goal: float) -> list[str]:
    m, one, many = block["model"], block["critical_path"]["one"], block["critical_path"]["many"]
    met = "met" if block["speedup"] >= goal else "NOT met"
    return [f"{title}: 1 worker {', '.join(f'{x:.1f}' for x in block['one_worker_s'])} s; {workers} workers "
            f"{', '.join(f'{x:.1f}' for x in block['workers_s'])} s",
            f"  speed-up median {block['speedup']:.2f}x (spread {block['spread'][0]:.2f}-{block['spread'][1]:.2f}), "
            f"goal >= {goal:g}x: {met}",
            f"  model {m['one_s']:.1f} s -> {m['many_s']:.1f} s, {m['speedup']:.2f}x: speed-up {m['error']:+.0%}, "
            f"{workers}-worker wall {m['wall_error']:+.0%} vs measured (goal within "
            f"{GOALS['model_error']:.0%}: {'met' if abs(m['error']) <= GOALS['model_error'] else 'NOT met'})",
            *([f"  the plan bounds it: the model, with no transfers, overheads or slowdown, gives "
               f"{m['speedup']:.2f}x"] if m["speedup"] < goal else []),
            "  critical path, seconds (the median pair):", *_path_lines("1 worker", one),
            *_path_lines(f"{workers} workers", many),
            *_stage1_lines(m["stage1"], workers),
            *_slowdown_lines(block.get("slowdown") or {}, workers),
            f"  pinning: 1 worker on cpus {one['pinning'].get('allowed')}, cores used {one['pinning'].get('cores_used')}; "
            f"{workers} workers on {many['pinning'].get('allowed')}, cores used {many['pinning'].get('cores_used')}"]


def _slowdown_lines(slow: dict[str, float], workers: int) -> list[str]:
    """The same tasks' compute on N workers against 1 (the model assumes none: a loss to the cores)."""
    if not slow:
        return []
    kinds = ", ".join(f"{k} {v:+.0%}" for k, v in sorted(slow.items(), key=lambda kv: -abs(kv[1])))
    return [f"  the same tasks' compute on {workers} workers vs 1 (ganged stage 1 left out): {kinds}"]


def _stage1_lines(s1: dict, workers: int) -> list[str]:
    """Stage 1's degree and seconds per side, measured and modelled (the model's gang handling)."""
    def seconds(xs: list[float]) -> str:
        return "/".join(f"{x:.1f}" for x in xs)

    return [f"  stage 1 ({name}): ran on gang(s) of {side['degree']} in {seconds(side['measured_s'])} s; model "
            f"{side['degree_model']} in {seconds(side['model_s'])} s"
            for name, side in (("1 worker", s1["one"]), (f"{workers} workers", s1["many"]))]


def report(result: dict) -> list[str]:
    """The human report of `scale`'s result."""
    sp, n = result["spec"], result["workers"]
    lines = [f"bench scale: {sp['width']}x{sp['height']}x{sp['frames']}, stage-2 tiles {sp['stage2_tiles']}, decode tiles "
             f"{sp['decode_tiles']}, pack "
             f"{sp['pack']}, the same plan on 1 worker and on {n} (each worker one core), {result['pairs']} pair(s); "
             f"{result['cores']} cores, load {result['load'][0]:.2f} before, {result['load'][3]:.2f} after",
             "  farms " + ("warm: each side first renders one small untimed render per worker (imports and models "
                           "loaded, as on a farm that has been up)" if result.get("warm") else
                           "cold: each side's workers start fresh (their first imports and model loads are timed)"),
             *_block_lines("one render", result["one"], n, GOALS["speedup"])]
    if result.get("model_gang"):
        g = result["model_gang"]
        dit = g["dit"]
        lines.insert(2, f"  the model's gang: this pack's DiT ({dit['layers']} blocks, {dit['video_width']} wide, "
                        f"{dit['itemsize']}-byte activations) over this machine's loopback "
                        f"({g['link_bytes_per_s'] / 1e9:.1f} GB/s measured)")
    if result["queue"]:
        lines += _block_lines(f"queue of {result['queue_renders']}", result["queue"], n, GOALS["queue_speedup"])
    return lines


def run(spec: dict, workers: int, pairs: int, queue: int, queue_pairs: int, data: Path | None, as_json: bool,
        warm: bool = False) -> None:
    """`farm bench scale`: measure, then print the report or one JSON line."""
    import json

    from farm_cli.services import ensure_tiny_pack
    from ltx_engine.tiny.tiny_pack import DIT_SIZES

    folder = common.data_dir(data)
    if spec["pack"] in DIT_SIZES:  # tiny or bench: written once into the data folder's packs/
        ensure_tiny_pack(folder, spec["pack"])
    if workers > len(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else {0}):
        typer.echo(f"bench scale: {workers} workers on fewer cores: they share cores", err=True)
    result = scale(spec, workers, pairs, queue, queue_pairs, folder / "packs", warm)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for line in report(result):
            typer.echo(line)
