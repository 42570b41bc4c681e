"""What memory this worker has, what its warm models may hold, and whether a task's DiT runs streamed:
read from the machine (or FARM_WORKER_MEMORY_MB / FARM_MODEL_BUDGET_MB), apart from running tasks."""

from __future__ import annotations

import os

import mlx.core as mx

from protos.kinds import facts

MEMORY_ENV = "FARM_WORKER_MEMORY_MB"


def device_memory_bytes() -> int:
    """The memory this worker advertises: FARM_WORKER_MEMORY_MB when set (a Mac shared with other work,
    or a test playing a 16 GB Mac), else unified memory on a Mac (Metal reports it), physical elsewhere."""
    mb = os.environ.get(MEMORY_ENV, "").strip()
    if mb:
        try:
            return int(float(mb) * 2**20)
        except ValueError:
            raise SystemExit(f"farm worker: {MEMORY_ENV}={mb!r} is not a number of megabytes") from None
    try:
        info = mx.device_info()
        if "memory_size" in info:
            return int(info["memory_size"])
    except Exception:  # noqa: BLE001 - no Metal on Linux
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def model_budget_bytes() -> int:
    """Memory warm models may hold: FARM_MODEL_BUDGET_MB when set (a Mac shared with other work, or a
    bench that makes model loads count, `farm bench affinity`), else ~60 % of the machine's memory."""
    mb = os.environ.get("FARM_MODEL_BUDGET_MB", "").strip()
    try:
        return int(float(mb) * 2**20) if mb else int(device_memory_bytes() * 0.6)
    except ValueError:
        raise SystemExit(f"farm worker: FARM_MODEL_BUDGET_MB={mb!r} is not a number of megabytes") from None


def streams(kind: str, params: dict, memory_bytes: int) -> bool:
    """Run this task with its DiT blocks streamed: a kind that may stream (every DiT kind but the HDR
    stage) whose predicted resident need (`min_memory_bytes`, the planner's cost model) is above this
    worker's memory (the lease gave it the task because its streamed need, `min_memory_stream_bytes`, fits)."""
    need = int(params.get("min_memory_bytes") or 0)
    return facts(kind).streams and bool(memory_bytes) and need > memory_bytes
