"""`farm bench guidance`: a guided step's wall time with its passes on 2 workers against 1.

A one-stage CFG render (2 passes per step: cond and uncond; STG and modality guidance off) runs through
a farm on this machine with 1 worker and with 2, in interleaved pairs. A step's wall time is from its
first pass leased to its guide step done (Redis clock); per render the median over its steps. It
prints both medians, the per-pair ratio (median and spread) beside the ideal 2x, and how much of a
2-worker step is the coordinator's combine and the passes' transfers. The ratio means something only
where a pass's forward dominates (a real pack, or a large token count).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import typer

from farm_cli import common

DEV_PACK = "tiny-dev"


def _label(task: str, render_id: str, steps: int) -> tuple[str | None, bool]:
    """(step label "sN", is a pass) of a guided stage-1 task; (None, False) for any other task."""
    parts = task.removeprefix(f"{render_id}.").split(".")
    if parts[0] != "stage1" or parts[1:2] == ["prep"]:
        return None, False
    if len(parts) == 1:  # the last guide step carries the stage's name
        return f"s{steps - 1}", False
    return parts[1], len(parts) == 3


def step_seconds(events: list[dict], render_id: str, steps: int) -> tuple[list[float], float, float]:
    """Per step: seconds from its first pass leased to its guide step done; and the summed seconds of
    the guide steps (leased to done) and of the passes' transfers (fetch + upload)."""
    leased: dict[str, float] = {}
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    combine = transfer = 0.0
    for e in events:
        task = str(e.get("task") or "")
        label, is_pass = _label(task, render_id, steps)
        if label is None:
            continue
        ts = float(e["ts"])
        if e.get("type") == "task_leased":
            leased[task] = ts
            if is_pass:
                starts[label] = min(starts.get(label, ts), ts)
        elif e.get("type") == "task_done" and is_pass:
            metrics = e.get("metrics") or {}
            transfer += float(metrics.get("fetch_s") or 0.0) + float(metrics.get("upload_s") or 0.0)
        elif e.get("type") == "task_done":
            ends[label] = ts
            combine += (ts - leased.get(task, ts)) / 1000.0
    walls = [(ends[k] - starts[k]) / 1000.0 for k in starts if k in ends]
    return walls, combine, transfer


def farm_steps(spec: dict, data: Path, workers: int) -> tuple[list[float], float, float]:
    """One render through a farm on this machine with `workers` workers: step_seconds of its events."""
    from farm_cli.client import FarmClient
    from farm_cli.services import local_farm

    with local_farm(data, workers=workers) as (address, token, _procs), FarmClient(address, token, timeout=60) as farm:
        render_id = farm.submit(dict(spec))
        events = list(farm.watch(render_id))
        render = farm.get(render_id)
    if render["state"] != "done":
        common.fail(f"bench render {render['state']}: {render.get('error')}", code=1)
    return step_seconds(events, render_id, int(spec["steps"]))


def run(height: int, width: int, frames: int, steps: int, pack: str, data: Path | None, pairs: int) -> None:
    """Interleaved 1-worker / 2-worker farm renders of the same guided one-stage render."""
    folder = common.data_dir(data)
    if pack == DEV_PACK and not (folder / "packs" / DEV_PACK).is_dir():
        from ltx_engine.tiny.tiny_pack import write_tiny_pack

        write_tiny_pack(folder / "packs" / DEV_PACK, seed=0, layout="dev-only")
    spec = {"prompt": "a fox running through fresh snow", "height": height, "width": width, "frames": frames,
            "frame_rate": 24.0, "seed": 11, "pack": pack, "audio": False, "decode_tiles": "off",
            "pipeline": "one-stage", "steps": steps, "cfg_scale": 3.0, "stg_scale": 0.0, "modality_scale": 1.0,
            "audio_cfg_scale": 7.0, "audio_stg_scale": 0.0, "audio_modality_scale": 1.0}
    one, two, shares = [], [], []
    for pair in range(pairs):
        for workers, into in ((1, one), (2, two)):
            with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp:
                run_data = Path(tmp) / "data"
                run_data.mkdir()
                (run_data / "packs").symlink_to(folder / "packs", target_is_directory=True)
                walls, combine, transfer = farm_steps(spec, run_data, workers)
            into.append(statistics.median(walls))
            if workers == 2:
                shares.append((combine + transfer) / max(1e-9, sum(walls)))
        typer.echo(f"pair {pair + 1}: step 1 worker {one[-1]:.3f} s, 2 workers {two[-1]:.3f} s, "
                   f"ratio {one[-1] / two[-1]:.3f}", err=True)
    ratios = [a / b for a, b in zip(one, two, strict=True)]
    med = statistics.median
    typer.echo(f"guided one-stage (cfg: 2 passes per step), {width}x{height}x{frames}, {steps} steps, pack {pack}, "
               f"{pairs} interleaved pairs")
    typer.echo(f"step wall seconds: 1 worker {med(one):.3f}, 2 workers {med(two):.3f}")
    typer.echo(f"speed-up 2 workers / 1: median {med(ratios):.3f} (spread {min(ratios):.3f}-{max(ratios):.3f}), "
               f"ideal 2.000, goal >= 1.8: {'met' if med(ratios) >= 1.8 else 'NOT met'}")
    typer.echo(f"combine + transfers: {med(shares):.3f} of a 2-worker step (goal <= 0.1)")
