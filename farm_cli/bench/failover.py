"""`farm bench failover`: how long a dead worker's task waits before another worker has it.

A farm on this machine (embedded Redis, the coordinator in this process, N workers kept alive by the
supervisor of `farm up`) renders the tiny pack; each round submits a render, kill -9s the worker that
holds its stage-1 task and measures, on the farm's own clock, the time from the kill to that task's
next lease. The connection-based detection answers in well under a second; the 30 s lease deadline
would be the answer without it.
"""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from farm_cli import common

SPEC = {"prompt": "a fox running through fresh snow", "height": 128, "width": 256, "frames": 9,
        "frame_rate": 24.0, "seed": 3, "pack": "tiny", "stage2_tiles": "2x2", "tile_overlap": 1}


def _task(farm, render_id: str, suffix: str) -> dict | None:
    return next((t for t in farm.get(render_id)["tasks"] if t["id"].endswith(suffix)), None)


def wait_for(check: Callable[[], object], timeout: float, step: float = 0.01) -> object:
    """The first truthy answer of check() within timeout seconds, polled every step; None when none came."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(step)
    return None


def one_kill(farm, procs: list, seed: int, timeout: float = 120) -> tuple[str, float | None]:
    """Submit, kill -9 the stage-1 holder, return (worker, seconds from kill to the re-lease or None)."""
    render_id = farm.submit({**SPEC, "seed": seed})
    leased = wait_for(lambda: (t := _task(farm, render_id, ".stage1")) and t["state"] == "leased" and t, timeout)
    if not leased:
        farm.cancel(render_id)
        return "?", None
    worker = leased["worker"]
    killed_ms = time.time() * 1000
    os.kill(procs[int(worker.rsplit("-", 1)[1]) - 1].pid, signal.SIGKILL)
    again = wait_for(lambda: (t := _task(farm, render_id, ".stage1")) and t["worker"] != worker
                      and t["state"] in ("leased", "done") and t, 60, 0.02)
    farm.cancel(render_id)
    return worker, (again["leased_ms"] - killed_ms) / 1000 if again else None


def failover(kills: int, workers: int, data: Path | None) -> None:
    """Print each kill's seconds to re-lease and their median."""
    import typer

    from farm_cli.client import FarmClient
    from farm_cli.services import ensure_tiny_pack, local_farm

    folder = common.data_dir(data)
    ensure_tiny_pack(folder)
    times = []
    with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp:
        run_data = Path(tmp) / "data"
        run_data.mkdir()
        (run_data / "packs").symlink_to(folder / "packs", target_is_directory=True)
        with local_farm(run_data, workers) as (address, token, procs), FarmClient(address, token, timeout=30) as farm:
            for i in range(kills):
                worker, seconds = one_kill(farm, procs, seed=100 + i)
                shown = f"{seconds:.3f} s" if seconds is not None else "not re-leased within 60 s"
                typer.echo(f"kill {i + 1}: {worker} kill -9 -> stage 1 leased again after {shown}")
                if seconds is not None:
                    times.append(seconds)
                time.sleep(3.0)  # the supervisor starts the killed worker again
    if not times:
        common.fail("no kill was measured", code=1)
    typer.echo(f"failover: median {statistics.median(times):.3f} s over {len(times)} kills "
               f"(max {max(times):.3f} s; goal < 5 s)")
