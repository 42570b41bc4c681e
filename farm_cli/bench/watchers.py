"""`farm bench watchers`: worker RPC latency during a tiled render, with and without a crowd of
`farm watch` clients, on a real farm on this machine.

This process is the coordinator (`local_farm`). Each round submits the same tiled render with no
worker running; on the crowd side another process opens N Watch streams on it (threads over a few
channels, at nice 19: on a LAN its CPU is other Macs') and waits until each has its first event. Then a probe process starts sending a worker RPC
(Heartbeat, answered after its Lua round trip) every few milliseconds, the worker processes start, and
the probe stops when the render ends: both sides time the same stretch, crowd or not. The sides
alternate for several pairs; the p99 of each side, the per-pair ratio's median and spread, and the
goal (the crowd's p99 within 2x of the quiet run's) are printed. The token reaches the children in the
environment, never on their command line.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import typer

GOAL_RATIO = 2.0
PROBE_EVERY_S = 0.01
CHANNELS = 10
# On a LAN the watchers' own CPU is other machines'; on this one the crowd process yields its cores to the
# coordinator, so the ratio measures what the crowd costs the coordinator, not the crowd's own parsing.
CROWD_NICE = 19
SPEC = {"prompt": "a fox in the snow", "height": 384, "width": 512, "frames": 17, "frame_rate": 24.0, "seed": 5,
        "pack": "tiny", "stage2_tiles": "2x2", "tile_overlap": 2}


def probe(address: str, render_id: str) -> None:
    """Child: time one Heartbeat every PROBE_EVERY_S until SIGTERM; print the latencies (ms) as JSON."""
    from protos import farm_pb2, farm_pb2_grpc
    from protos.auth import auth_metadata, farm_channel

    token = os.environ["FARM_TOKEN"]
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    samples: list[float] = []
    with farm_channel(address, token) as channel:
        stub, md = farm_pb2_grpc.FarmWorkerStub(channel), auth_metadata(token)
        request = farm_pb2.HeartbeatRequest(task_id=f"{render_id}.probe", worker_id="bench-probe", fence=1)
        stub.Heartbeat(request, timeout=30, metadata=md)  # the channel is up before the clock runs
        print("ready", flush=True)
        while not stopping.is_set():
            start = time.perf_counter()
            stub.Heartbeat(request, timeout=30, metadata=md)
            samples.append((time.perf_counter() - start) * 1e3)
            stopping.wait(PROBE_EVERY_S)
    print(json.dumps(samples), flush=True)


def crowd(address: str, render_id: str, watchers: int) -> None:
    """Child: N watchers of the render over a few channels; 'ready' once each has its first event, then
    a JSON line {ended, events} when they have all returned."""
    from farm_cli.client import FarmClient

    token = os.environ["FARM_TOKEN"]
    clients = [FarmClient(address, token, timeout=60) for _ in range(CHANNELS)]
    first = threading.Semaphore(0)
    watchers = int(watchers)
    counts = [0] * watchers

    def watch(i: int) -> None:
        for _event in clients[i % CHANNELS].watch(render_id):
            if counts[i] == 0:
                first.release()
            counts[i] += 1

    threads = [threading.Thread(target=watch, args=(i,), daemon=True) for i in range(watchers)]
    for t in threads:
        t.start()
    for _ in range(watchers):
        first.acquire()
    print("ready", flush=True)
    for t in threads:
        t.join()
    print(json.dumps({"ended": sum(1 for c in counts if c), "events": sum(counts)}), flush=True)


def _child(function: str, *args: str, token: str, nice: int = 0) -> subprocess.Popen:
    code = f"from farm_cli.bench.watchers import {function}; import sys; {function}(*sys.argv[1:])"
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "FARM_TOKEN": token, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    niced = ["nice", "-n", str(nice)] if nice else []
    proc = subprocess.Popen([*niced, sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env)
    if proc.stdout is None or proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"bench child {function} did not start")
    return proc


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def _workers(address: str, folder: Path, count: int) -> list[subprocess.Popen]:
    from farm_cli.services import worker_command

    log = open(folder / "bench-workers.log", "ab")  # noqa: SIM115 - the children keep their own descriptor
    with log:
        return [subprocess.Popen(worker_command(address, folder / "token", folder / "packs", f"bench-{i + 1}",
                                                folder / f"cache-{i + 1}", wait_ms=500),
                                 stdout=log, stderr=subprocess.STDOUT) for i in range(count)]


def one_round(farm, address: str, token: str, folder: Path, watchers: int,
              workers: int) -> tuple[list[float], dict | None, float]:
    """(probe latencies in ms, the crowd's tally or None, render seconds) of one tiled render."""
    render_id = farm.submit(dict(SPEC))
    crowd_proc = _child("crowd", address, render_id, str(watchers), token=token, nice=CROWD_NICE) if watchers else None
    probe_proc = _child("probe", address, render_id, token=token)
    started = time.monotonic()
    procs = _workers(address, folder, workers)
    try:
        for _event in farm.watch(render_id):
            pass
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
    seconds = time.monotonic() - started
    probe_proc.send_signal(signal.SIGTERM)
    samples = json.loads(probe_proc.communicate(timeout=60)[0].strip().splitlines()[-1])
    tally = None
    if crowd_proc is not None:
        tally = json.loads(crowd_proc.communicate(timeout=120)[0].strip().splitlines()[-1])
    state = farm.get(render_id)["state"]
    if state != "done":
        raise RuntimeError(f"bench render {render_id} ended {state}")
    return samples, tally, seconds


def watchers_bench(watchers: int, pairs: int, workers: int, data: Path | None) -> None:
    """Interleaved quiet / crowd rounds; prints each round and the paired p99 ratio with the goal."""
    from farm_cli.client import FarmClient
    from farm_cli.services import ensure_tiny_pack, local_farm

    folder = Path(data) if data else Path(tempfile.mkdtemp(prefix="farm-bench-watchers-"))
    ensure_tiny_pack(folder)
    ratios, quiet_p99, crowd_p99 = [], [], []
    with local_farm(folder, 0) as (address, token, _procs), FarmClient(address, token, timeout=60) as farm:
        one_round(farm, address, token, folder, 0, workers)  # warm: pack hashes, blob caches, channels
        for pair in range(pairs):
            result = {}
            for side in ((0, watchers) if pair % 2 == 0 else (watchers, 0)):
                samples, tally, seconds = one_round(farm, address, token, folder, side, workers)
                result[side] = p99(samples)
                extra = f", {tally['ended']}/{side} watchers saw it end ({tally['events']} events)" if tally else ""
                typer.echo(f"pair {pair + 1} {'crowd' if side else 'quiet'}: render {seconds:.1f} s, worker RPC p50 "
                           f"{statistics.median(samples):.1f} ms p99 {result[side]:.1f} ms ({len(samples)} calls){extra}")
            quiet_p99.append(result[0])
            crowd_p99.append(result[watchers])
            ratios.append(result[watchers] / result[0])
    typer.echo(f"worker RPC p99: quiet median {statistics.median(quiet_p99):.1f} ms, with {watchers} watchers "
               f"median {statistics.median(crowd_p99):.1f} ms")
    typer.echo(f"p99 ratio crowd/quiet over {pairs} pairs: median {statistics.median(ratios):.2f} "
               f"(min {min(ratios):.2f}, max {max(ratios):.2f}); goal <= {GOAL_RATIO:.1f}: "
               f"{'met' if statistics.median(ratios) <= GOAL_RATIO else 'NOT met'}")
