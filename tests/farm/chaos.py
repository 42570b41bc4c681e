"""A farm to break on purpose: the coordinator in this process, workers as real processes that a test
kills (-9), freezes (SIGSTOP) or restarts, and the checks every chaos test ends with (each task's
outputs byte-identical to `farm render --local`, the mp4's frames identical)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import av
import numpy as np

from farm_cli.client import FarmClient
from tests.farm.farm_harness import start_worker

# Small enough for CI on two cores, big enough for every distributed path: stage 2 in 2x2 tiles over
# two steps (reducer steps between them) and a decode in 2 spatial tiles.
CHAOS_SPEC = {"prompt": "a fox", "height": 128, "width": 256, "frames": 9, "frame_rate": 24.0, "pack": "tiny",
              "stage2_tiles": "2x2", "tile_overlap": 1, "decode_tiles": "32,128,128"}


def spec(seed: int) -> dict:
    return {**CHAOS_SPEC, "seed": seed}


class ChaosFarm:
    """serve() + named worker processes that can be killed and started again under the same name."""

    def __init__(self, store, data: Path, packs: Path, workers: int, lease_ms: int = 30_000,
                 **serve_kwargs) -> None:
        self.store, self.data, self.packs = store, Path(data), Path(packs)
        self.names = [f"w{i + 1}" for i in range(workers)]
        self.lease_ms, self.serve_kwargs = lease_ms, serve_kwargs
        self.procs: dict[str, subprocess.Popen] = {}
        self.dead: set[str] = set()

    def __enter__(self) -> ChaosFarm:
        from coordinator.api.auth import load_or_create_token
        from coordinator.server import serve

        self.token = load_or_create_token(self.data)
        self.server, port = serve(self.store, self.data, "127.0.0.1", 0, self.token, lease_ms=self.lease_ms,
                                  expiry_interval_s=0.2, **self.serve_kwargs)
        self.address = f"127.0.0.1:{port}"
        for name in self.names:
            self.start(name)
        self.client = FarmClient(self.address, self.token, timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        from coordinator.server import stop

        self.client.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        stop(self.server)

    def start(self, name: str, packs: Path | None = None) -> subprocess.Popen:
        self.procs[name] = start_worker(self.address, self.token, packs or self.packs, name, self.data)
        self.dead.discard(name)
        return self.procs[name]

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        os.kill(self.procs[name].pid, sig)
        if sig == signal.SIGKILL:
            self.procs[name].wait(10)
            self.dead.add(name)

    def log(self, name: str) -> str:
        return (self.data / f"{name}.log").read_text(errors="replace")

    def held_by(self, worker: str) -> list[str]:
        """Tasks leased to `worker` right now (from the store)."""
        tids = self.store.client.zrange(self.store.key("leases"), 0, -1)
        return [t for t in tids if self.store.client.hget(self.store.key("task", t), "worker") == worker]

    def busy(self) -> list[tuple[str, str]]:
        """(worker, task) for every live worker process holding a lease."""
        return [(w, t) for w in self.names if w not in self.dead for t in self.held_by(w)]


def wait_released(store, task_id: str, worker: str, timeout: float, since: float | None = None) -> float | None:
    """Seconds from `since` (a time.monotonic(), default now) until `task_id` is leased by another worker
    than `worker` (or finished); None on timeout."""
    start = time.monotonic() if since is None else since
    while time.monotonic() - start < timeout:
        t = store.client.hmget(store.key("task", task_id), "state", "worker")
        if t[0] == "done" or (t[0] == "leased" and t[1] != worker):
            return time.monotonic() - start
        time.sleep(0.01)
    return None


class Killer(threading.Thread):
    """Every `every_s`, kill -9 a random worker that holds a task (no task kind is spared; a task is
    killed once at most, so renders move on and the kills spread over every kind) and, with restart,
    start it again at once under the same name. Records (worker, task, seconds to re-lease)."""

    def __init__(self, farm: ChaosFarm, every_s: float, restart: bool, max_kills: int, keep: int = 0,
                 seed: int = 0) -> None:
        super().__init__(name="chaos-killer", daemon=True)
        self.farm, self.every_s, self.restart = farm, every_s, restart
        self.max_kills, self.keep = max_kills, keep
        self.rng = random.Random(seed)
        self.kills: list[tuple[str, str, float | None]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s) and len(self.kills) < self.max_kills:
            alive = [w for w in self.farm.names if w not in self.farm.dead]
            hit = {t for _w, t, _s in self.kills}
            busy = [(w, t) for w, t in self.farm.busy() if t not in hit]
            if not busy or len(alive) <= self.keep:
                continue
            worker, task = self.rng.choice(busy)
            killed_at = time.monotonic()
            self.farm.kill(worker)
            seconds = wait_released(self.farm.store, task, worker, 1.0, killed_at)  # when another worker is free
            self.kills.append((worker, task, seconds))
            if self.restart:
                self.farm.start(worker)

    def stop(self) -> None:
        self.done.set()
        self.join(30)


def outputs_by_name(tasks: list[dict], render_id: str) -> dict[str, dict[str, str]]:
    """{task name within the render: {output: sha}} from a farm render's task list."""
    return {t["id"][len(render_id) + 1:]: dict(t.get("outputs") or {}) for t in tasks}


def assert_same_outputs(farm_tasks: list[dict], render_id: str, local: dict[str, dict[str, str]]) -> None:
    """Every task's every output blob is the same sha256 as the local run's: bit-identical bytes."""
    farm = outputs_by_name(farm_tasks, render_id)
    local = {tid[len("local") + 1:]: outs for tid, outs in local.items()}
    assert sorted(farm) == sorted(local)
    differ = [name for name in farm if farm[name] != local[name]]
    assert not differ, f"outputs differ from --local: {differ}"


def mp4_frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def assert_same_video(a: Path, b: Path) -> None:
    fa, fb = mp4_frames(a), mp4_frames(b)
    assert len(fa) == len(fb) > 0 and all(np.array_equal(x, y) for x, y in zip(fa, fb, strict=True))
