"""What a render's metadata JSON says: spec, seed, pack, tiling, timings per stage, workers used, and
the assembler's peak memory. Pure, except the tracemalloc-based PeakMemory and the file write."""

from __future__ import annotations

import json
import threading
import tracemalloc
from pathlib import Path
from typing import Any

_trace_lock = threading.Lock()
_tracers = 0
_started_here = False


class PeakMemory:
    """Peak Python/numpy heap growth (tracemalloc) over a block: what assembly itself allocated.

    tracemalloc is process-wide: concurrent assemblies share one trace (the tracer is started by the
    first and stopped by the last), so each sees the peak of everything allocated while it ran.
    """

    def __init__(self) -> None:
        self.peak = 0
        self._base = 0

    def __enter__(self) -> PeakMemory:
        global _tracers, _started_here
        with _trace_lock:
            if _tracers == 0 and not tracemalloc.is_tracing():
                tracemalloc.start()
                _started_here = True
            _tracers += 1
            tracemalloc.reset_peak()
            self._base = tracemalloc.get_traced_memory()[0]
        return self

    def __exit__(self, *exc: object) -> None:
        global _tracers, _started_here
        with _trace_lock:
            self.peak = max(0, tracemalloc.get_traced_memory()[1] - self._base)
            _tracers -= 1
            if _tracers == 0 and _started_here:
                tracemalloc.stop()
                _started_here = False


def stage_of(name: str) -> str:
    """A task's stage: the first part of its name in the plan ("stage2.s0.t1" → "stage2")."""
    return name.split(".", 1)[0]


def stage_timings(runs: list[dict]) -> dict[str, dict]:
    """Per stage: tasks, wall seconds (first start → last end), summed task seconds, workers."""
    stages: dict[str, dict[str, Any]] = {}
    for run in runs:
        stage = stages.setdefault(stage_of(str(run["name"])), {"tasks": 0, "start": None, "end": None,
                                                                 "compute_s": 0.0, "workers": set()})
        stage["tasks"] += 1
        stage["compute_s"] += float(run.get("seconds") or 0.0)
        if run.get("worker"):
            stage["workers"].add(str(run["worker"]))
        start, end = int(run.get("start_ms") or 0), int(run.get("end_ms") or 0)
        if start and end:
            stage["start"] = start if stage["start"] is None else min(stage["start"], start)
            stage["end"] = end if stage["end"] is None else max(stage["end"], end)
    return {
        name: {"tasks": s["tasks"], "compute_s": round(s["compute_s"], 3), "workers": sorted(s["workers"]),
               "wall_s": round((s["end"] - s["start"]) / 1000.0, 3) if s["start"] is not None else None}
        for name, s in stages.items()
    }


def provenance(runs: list[dict]) -> dict:
    """Which worker, chip, versions and determinism class produced each task's output, and the classes
    the render ran on: its bits depend only on its spec and these (docs/ARCHITECTURE.md, mixed fleets)."""
    made = {str(r["name"]): r["made_by"] for r in runs if r.get("made_by")}
    return {"tasks": made, "classes": sorted({str(m.get("fingerprint") or "") for m in made.values()}),
            "versions": sorted({f"ltx-farm {m.get('project_version') or '?'}, mlx {m.get('mlx_version') or '?'}"
                                for m in made.values()})}


def build_metadata(spec: dict, *, frames: int, fps: float, audio: dict | None, assembly: dict,
                   runs: list[dict], outputs: dict) -> dict:
    """The metadata JSON written next to every output."""
    starts = [int(r["start_ms"]) for r in runs if r.get("start_ms")]
    ends = [int(r["end_ms"]) for r in runs if r.get("end_ms")]
    return {
        "spec": spec,
        "seed": spec.get("seed"),
        "pack": spec.get("pack"),
        "frames": frames,
        "width": spec.get("width"),
        "height": spec.get("height"),
        "fps": fps,
        "audio": audio,
        "audio_sample_rate": audio["sample_rate"] if audio else None,
        "tiling": {"stage2_tiles": spec.get("stage2_tiles"), "tile_overlap": spec.get("tile_overlap"),
                   "temporal_upscalings": spec.get("temporal_upscalings"),
                   "decode_tiles": spec.get("decode_tiles"), "decode_tile_count": assembly.get("decode_tiles"),
                   "decode_window_frames": assembly.get("window_frames")},
        "timings": {"stages": stage_timings(runs), "assemble_s": assembly.get("seconds"),
                    "tasks_wall_s": round((max(ends) - min(starts)) / 1000.0, 3) if starts and ends else None},
        "workers": sorted({str(r["worker"]) for r in runs if r.get("worker")}),
        "provenance": provenance(runs),
        "assembly": assembly,
        "outputs": outputs,
    }


def write_metadata(path: Path, meta: dict) -> None:
    Path(path).write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
