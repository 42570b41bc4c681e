"""`farm bench dealing`: speed-aware vs even dealing of stage-2 tiles on a throttled fleet, in interleaved pairs.

Why: a tiled step ends when its slowest tile does, so on a mixed fleet the slow Mac must not take the
step's last tile when a fast one would end it sooner (lease.lua's dealing, placement.deal_takes). Each
pair renders the same spec twice on one warm farm, with the coordinator's dealing policy on and off
(set_policy.lua), alternating which goes first. A step's time runs from its tiles being queued to its
last tile done (the render's events); the ideal is the step's tiles over the fleet's summed speed (each
worker's tiles per second, measured over the whole bench, both sides pooled).
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import typer

from farm_cli import common
from protos.states import TERMINAL

GOAL_IDEAL = 1.15  # step time within 15 % of the ideal speed-weighted split
TILE = re.compile(r"\.stage2\.s(\d+)\.t\d+$")


def spawn_workers(address: str, data: Path, throttles: list[float], env: dict[str, str] | None = None,
                  ) -> list[subprocess.Popen]:
    """One worker process per throttle factor, as `farm worker --throttle` runs them (`env`: added to ours)."""
    procs = []
    for i, factor in enumerate(throttles):
        cmd = [sys.executable, "-m", "worker.agent", "--coordinator", address, "--token-file", str(data / "token"),
               "--packs-dir", str(data / "packs"), "--worker-id", f"w{i + 1}-x{factor:g}",
               "--cache-dir", str(data / f"cache-{i + 1}"), "--wait-ms", "1000", "--throttle", str(factor)]
        log = open(data / f"worker-{i + 1}.log", "ab")  # noqa: SIM115 - the child keeps it
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}))
    return procs


@contextlib.contextmanager
def policy_farm(data: Path) -> Iterator[tuple[str, str, object]]:
    """Embedded Redis and the coordinator in this process, with its store at hand (to set the policy)."""
    from coordinator.api.auth import load_or_create_token
    from coordinator.server import serve, stop
    from coordinator.state import redis_server
    from coordinator.state.store import FarmStore

    with redis_server.EmbeddedRedis(data / "redis", persistence=False) as server:
        store = FarmStore(redis_server.connect(server.url))
        token = load_or_create_token(data)
        srv, port = serve(store, data, "127.0.0.1", 0, token)
        try:
            yield f"127.0.0.1:{port}", token, store
        finally:
            stop(srv)


@contextlib.contextmanager
def throttled_fleet(spec: dict, throttles: list[float], data: Path | None, env: dict[str, str] | None = None,
                    ) -> Iterator[tuple[object, object]]:
    """A throttled farm on this machine (one worker per factor, `env` added to theirs): its client and store."""
    from farm_cli.client import FarmClient
    from farm_cli.services import _stop_processes, ensure_tiny_pack

    folder = common.data_dir(data)
    if spec["pack"] == "tiny":
        ensure_tiny_pack(folder)
    with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp:
        run_data = Path(tmp) / "data"
        run_data.mkdir()
        (run_data / "packs").symlink_to(folder / "packs", target_is_directory=True)
        with policy_farm(run_data) as (address, token, store):
            procs = spawn_workers(address, run_data, throttles, env)
            try:
                with FarmClient(address, token, timeout=60) as farm:
                    yield farm, store
            finally:
                _stop_processes(procs)


def render_done(farm, spec: dict, timeout_s: float = 1800) -> str:
    """Submit `spec` and wait for it to end; its id (a render that does not end done fails the bench)."""
    render_id = farm.submit(spec)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = farm.get(render_id).get("state")
        if state in TERMINAL:
            if state != "done":
                common.fail(f"bench render {render_id} {state}: {farm.get(render_id).get('error')}", code=1)
            return render_id
        time.sleep(0.25)
    common.fail(f"bench render {render_id} did not end in {timeout_s:.0f} s", code=1)
    raise AssertionError  # unreachable: fail exits


def events(store, render_id: str) -> list[dict]:
    """Every event of a render, oldest first."""
    out, last = [], "0"
    while batch := store.read_events(render_id, last, count=1000):
        out += [e for _, e in batch]
        last = batch[-1][0]
    return out


def step_seconds(store, render_id: str) -> list[float]:
    """Per tiled stage-2 step: seconds from its first tile queued to its last tile done."""
    queued: dict[int, int] = {}
    done: dict[int, int] = {}
    for e in events(store, render_id):
        m = TILE.search(str(e.get("task", "")))
        if m and e.get("type") == "task_queued":
            queued[int(m.group(1))] = min(queued.get(int(m.group(1)), e["ts"]), e["ts"])
        elif m and e.get("type") == "task_done":
            done[int(m.group(1))] = max(done.get(int(m.group(1)), 0), e["ts"])
    return [(done[s] - queued[s]) / 1000 for s in sorted(queued) if s in done]


def tile_runs(store, render_id: str) -> list[tuple[str, float]]:
    """(worker, lease-to-done seconds) of each stage-2 tile of a render."""
    return [(t["worker"], (t["done_ms"] - t["leased_ms"]) / 1000) for t in store.render_tasks(render_id)
            if TILE.search(t["id"]) and t["state"] == "done"]


def ideal_seconds(tiles: int, seconds_per_tile: dict[str, float]) -> float:
    """A step of `tiles` equal tiles split by speed with no rounding: tiles over the summed tile rates."""
    return tiles / sum(1 / s for s in seconds_per_tile.values() if s > 0)


def run(spec: dict, throttles: list[float], pairs: int, data: Path | None) -> None:
    """Warm the farm up (it learns each worker's speed), then `pairs` interleaved pairs on/off; print them."""
    rows, runs = [], []
    with throttled_fleet(spec, throttles, data) as (farm, store):
        render_done(farm, {**spec, "seed": 1})
        for i in range(pairs):
            side = {}
            for dealing in (("1", "0") if i % 2 == 0 else ("0", "1")):
                store.set_policy(dealing=dealing)
                rid = render_done(farm, {**spec, "seed": 1})
                side[dealing] = (statistics.median(step_seconds(store, rid)), Counter(w for w, _ in tile_runs(store, rid)))
                runs += tile_runs(store, rid)
            rows.append(side)
    per_worker = defaultdict(list)
    for worker, seconds in runs:
        per_worker[worker].append(seconds)
    _print(spec, throttles, rows, {w: statistics.median(s) for w, s in per_worker.items()})


def _print(spec: dict, throttles: list[float], rows: list[dict], speeds: dict[str, float]) -> None:
    tiles = 1
    for n in str(spec["stage2_tiles"]).split("x"):
        tiles *= int(n)
    ideal = ideal_seconds(tiles, speeds)
    typer.echo(f"Dealing: {spec['width']}x{spec['height']}x{spec['frames']}, stage-2 tiles {spec['stage2_tiles']} "
               f"({tiles} per step), workers at throttle {', '.join(f'{t:g}x' for t in throttles)}")
    typer.echo("seconds per tile (median, both sides): " + ", ".join(f"{w} {s:.2f}" for w, s in sorted(speeds.items()))
               + f"; ideal step {ideal:.2f} s")
    typer.echo(f"{'pair':<6}{'speed-aware s':>14}{'even s':>9}{'aware/even':>12}{'aware/ideal':>13}  tiles aware | even")
    ratios, to_ideal = [], []
    for i, side in enumerate(rows):
        (on, on_tiles), (off, off_tiles) = side["1"], side["0"]
        ratios.append(on / off)
        to_ideal.append(on / ideal)
        typer.echo(f"{i + 1:<6}{on:>14.2f}{off:>9.2f}{on / off:>12.2f}{on / ideal:>13.2f}  "
                   f"{dict(sorted(on_tiles.items()))} | {dict(sorted(off_tiles.items()))}")
    typer.echo(f"aware/even: median {statistics.median(ratios):.2f} (spread {min(ratios):.2f}-{max(ratios):.2f}); "
               "goal < 1 (speed-aware beats even dealing)")
    typer.echo(f"aware/ideal: median {statistics.median(to_ideal):.2f} (spread {min(to_ideal):.2f}-{max(to_ideal):.2f});"
               f" goal <= {GOAL_IDEAL:.2f} (within 15 % of the ideal speed-weighted split)")
