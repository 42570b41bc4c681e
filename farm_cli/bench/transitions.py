"""`farm bench transitions` (alias `scheduler`): lease→complete transitions per second, N simulated
workers, through the store's Lua alone and end to end over gRPC, on a real Redis and coordinator.

Store side: N threads in this process call FarmStore.lease once, then complete_and_lease, as the
server does (the Lua scripts and Redis round trips, nothing else). gRPC side: this process is the
coordinator (`serve()`); a child process runs N worker threads that Register, Lease once, then Complete
with the next lease riding on each reply, as agents do (no blobs: the tasks expect no outputs); the same
threads also time one no-op RPC (a health check through the same server and interceptors) per
"transition": the ceiling gRPC alone allows. Sides alternate for several pairs; medians, spreads and the
goal are printed, with the CPU each process spends per transition (on a few cores that sum is the bound)
and what the farm's own work adds to a no-op RPC. A held task of another capability keeps each bench
render from finishing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import typer

from protos.defaults import LEASE_MS

GOAL_PER_S = 2000.0
NOOP_PER_WORKER = 40  # no-op "transitions" each simulated worker makes in the ceiling round
CAPABILITY = "bench"


def _tasks(render_id: str, count: int) -> list[dict]:
    tasks = [{"id": f"{render_id}.t{i}", "kind": "bench", "params": {}, "inputs": {}, "deps": [],
              "capability": CAPABILITY} for i in range(count)]
    return tasks + [{"id": f"{render_id}.hold", "kind": "bench", "params": {}, "inputs": {}, "deps": [],
                     "capability": "bench-hold"}]


def _drive(workers: int, one: Callable[[int], int]) -> float:
    """Run `one(worker_index)` (which loops until the queue is empty, returning its count) on N threads;
    transitions (lease + complete pairs) per second."""
    counts = [0] * workers
    barrier = threading.Barrier(workers + 1)

    def run(i: int) -> None:
        barrier.wait()
        counts[i] = one(i)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def store_side(store, workers: int, count: int, render_id: str) -> float:
    store.create_render(render_id, {}, _tasks(render_id, count))

    def one(i: int) -> int:  # as the server calls: a first lease, then each result with the next lease
        done, wid = 0, f"bench-w{i}"
        task = store.lease(wid, [CAPABILITY], LEASE_MS, seen=True)
        while task is not None:
            _, task = store.complete_and_lease(str(task["id"]), wid, int(task["fence"]), {}, {}, [CAPABILITY], LEASE_MS)
            done += 1
        return done

    return _drive(workers, one)


def child_main(address: str, token: str, workers: str) -> None:
    """The gRPC side's workers: one line per command ("go"), one line back (transitions/s)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from protos import farm_pb2, farm_pb2_grpc
    from protos.auth import auth_metadata, farm_channel

    channel, metadata = farm_channel(address, token), auth_metadata(token)
    stub = farm_pb2_grpc.FarmWorkerStub(channel)
    n = int(workers)
    for i in range(n):
        stub.Register(farm_pb2.WorkerInfo(worker_id=f"bench-g{i}", capabilities_json="{}"), timeout=30,
                      metadata=metadata)

    def one(i: int) -> int:  # as an agent does: the next lease rides on each Complete
        done, wid = 0, f"bench-g{i}"
        ask = farm_pb2.LeaseRequest(worker_id=wid, capabilities=[CAPABILITY], wait_ms=0)
        lease = stub.Lease(ask, timeout=30, metadata=metadata)
        while lease.has_task:
            lease = stub.Complete(farm_pb2.CompleteRequest(task_id=lease.task_id, worker_id=wid, fence=lease.fence,
                                                           next=ask), timeout=30, metadata=metadata).next
            done += 1
        return done

    health = health_pb2_grpc.HealthStub(channel)

    def noop(i: int) -> int:  # one no-op RPC through the same server and interceptors = one transition
        for _ in range(count := NOOP_PER_WORKER):
            health.Check(health_pb2.HealthCheckRequest(service=""), timeout=30, metadata=metadata)
        return count

    for line in sys.stdin:
        cpu = time.process_time()
        rate = _drive(n, noop if line.strip() == "noop" else one)
        print(json.dumps({"rate": rate, "cpu_s": time.process_time() - cpu}), flush=True)


def _child_round(store, child, command: str, count: int, cpu: dict[str, list[float]]) -> float:
    """One round of the child's workers ("go": end to end, "noop": the ceiling); records the CPU ms per
    transition that the coordinator (this process), the workers and Redis spent."""
    own, redis_cpu = time.process_time(), store.server_cpu_s()
    child.stdin.write(f"{command}\n")
    child.stdin.flush()
    got = json.loads(child.stdout.readline())
    for side, spent in (("coordinator", time.process_time() - own), ("workers", got["cpu_s"]),
                        ("redis", store.server_cpu_s() - redis_cpu)):
        cpu.setdefault(f"{command} {side}", []).append(1000 * spent / count)
    return got["rate"]


def run_pairs(workers: int, count: int, pairs: int, data: Path,
              profile: bool = False) -> tuple[dict[str, list[float]], dict[str, list[float]], list[str]]:
    from coordinator.api.auth import load_or_create_token
    from coordinator.server import serve, stop
    from coordinator.state import redis_server
    from coordinator.state.store import FarmStore
    from farm_cli.bench.profile import StackSampler

    rates: dict[str, list[float]] = {"store": [], "grpc": [], "noop": []}
    cpu: dict[str, list[float]] = {}
    sampler = StackSampler() if profile else None
    with redis_server.EmbeddedRedis(data / "redis") as redis:
        store = FarmStore(redis_server.connect(redis.url), "bench")
        token = load_or_create_token(data)
        server, port = serve(store, data, "127.0.0.1", 0, token)
        root = Path(__file__).resolve().parent.parent
        env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        code = "import sys; from farm_cli.bench.transitions import child_main; child_main(*sys.argv[1:])"
        child = subprocess.Popen([sys.executable, "-c", code, f"127.0.0.1:{port}", token, str(workers)], env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            for pair in range(pairs):
                rates["store"].append(store_side(store, workers, count, f"bench-s{pair}"))
                store.create_render(f"bench-g{pair}", {}, _tasks(f"bench-g{pair}", count))
                if sampler is not None and pair == pairs - 1:  # the last round, sampled (its CPU not kept)
                    with sampler:
                        rates["grpc"].append(_child_round(store, child, "go", count, {}))
                else:
                    rates["grpc"].append(_child_round(store, child, "go", count, cpu))
                rates["noop"].append(_child_round(store, child, "noop", workers * NOOP_PER_WORKER, cpu))
        finally:
            child.stdin.close()
            child.wait(30)
            stop(server, grace=0)
    return rates, cpu, sampler.report() if sampler else []


def transitions(workers: int, count: int, pairs: int, data: Path | None, profile: bool = False) -> None:
    """Print transitions/s for both sides (median, spread), the per-pair ratio and the goal; the CPU each
    process spends per end-to-end transition (what bounds it on a few cores); with profile, where the
    coordinator's time goes (sampled stacks of the last gRPC round)."""
    with tempfile.TemporaryDirectory(prefix="farm-bench-transitions-", dir=data) as tmp:
        rates, cpu, hot = run_pairs(workers, count, pairs, Path(tmp), profile)
    med = statistics.median
    typer.echo(f"lease→complete, {workers} workers, {count} tasks per side, {pairs} interleaved pairs, "
               f"{os.cpu_count()} cores")
    for side, label in (("store", "store Lua alone"), ("grpc", "end to end over gRPC"),
                        ("noop", "1 no-op RPC (ceiling)")):
        r = rates[side]
        typer.echo(f"{label:22} {med(r):8.0f}/s (spread {min(r):.0f}-{max(r):.0f})")
    ratios = [g / s for g, s in zip(rates["grpc"], rates["store"], strict=True)]
    typer.echo(f"ratio gRPC / store {med(ratios):.2f} (spread {min(ratios):.2f}-{max(ratios):.2f}); goal end to end "
               f">= {GOAL_PER_S:.0f}/s: {'met' if med(rates['grpc']) >= GOAL_PER_S else 'NOT met'}")
    parts = {}
    for side, label in (("go", "end to end"), ("noop", "1 no-op RPC")):
        parts[side] = {k.split()[1]: med(v) for k, v in cpu.items() if k.startswith(f"{side} ")}
        if parts[side]:
            total = sum(parts[side].values())
            typer.echo(f"CPU ms per transition, {label}: " + ", ".join(f"{k} {v:.3f}" for k, v in parts[side].items())
                       + f"; sum {total:.3f} -> at most {1000 * (os.cpu_count() or 1) / total:.0f}/s on "
                       f"{os.cpu_count()} cores")
    if parts["go"] and parts["noop"]:
        typer.echo("the farm's own part (end to end less the no-op RPC), CPU ms per transition: " + ", ".join(
            f"{k} {v - parts['noop'][k]:.3f}" for k, v in parts["go"].items()))
    for line in hot:
        typer.echo(line)
