"""`farm bench eta`: how close the farm's ETA is to the time a render really had left, on a throttled fleet.

Why: the ETA (`farm ls`, `farm status`, `farm watch`, the dashboard) is the cost model's simulation of
the live fleet, corrected as tasks finish; its goal is to be within 20 % of the real remaining time
from 25 % progress on. This starts a farm on this machine with workers slowed by `--throttle`
(different speeds, like a mixed fleet of Macs), runs a warm-up render (the model learns each worker's
speed per kind from it), then samples the ETA of each measured render twice a second and compares it,
once the render is done, with the time that really remained.
"""

import statistics
import time
from pathlib import Path

import typer

from farm_cli import common
from protos.states import TERMINAL

GOAL = 0.20


def _samples(farm, render_id: str, every_s: float = 0.5) -> tuple[list[tuple[float, float, float]], float, str]:
    """(seconds since submit, progress, ETA) until the render ends; its end time and state."""
    t0, out = time.monotonic(), []
    while True:
        render = farm.get(render_id)
        now = time.monotonic() - t0
        if render.get("state") in TERMINAL:
            return out, now, str(render.get("state"))
        if render.get("eta_s") is not None:
            out.append((now, float(render.get("progress") or 0.0), float(render["eta_s"])))
        time.sleep(every_s)


def _errors(samples: list[tuple[float, float, float]], end_s: float) -> list[float]:
    """|ETA - real remaining| / real remaining for samples from 25 % progress on."""
    return [abs(eta - (end_s - t)) / (end_s - t) for t, progress, eta in samples
            if progress >= 0.25 and end_s - t > 0.5]


def run(spec: dict, throttles: list[float], renders: int, data: Path | None, warmups: int = 2) -> None:
    """Start the throttled farm, warm it up (`warmups` renders), measure `renders` renders, print the errors."""
    from farm_cli.bench.dealing import throttled_fleet

    with throttled_fleet(spec, throttles, data) as (farm, _store):
        for seed in range(1, warmups + 1):  # the model learns each worker's speeds
            _, _, state = _samples(farm, farm.submit({**spec, "seed": seed}))
            if state != "done":
                common.fail(f"warm-up render {state}", code=1)
        rows = [_measure(farm, spec, i) for i in range(renders)]
    _print(spec, throttles, rows)


def _measure(farm, spec: dict, i: int) -> tuple[float, list[float]]:
    render_id = farm.submit({**spec, "seed": 100 + i})
    samples, end_s, state = _samples(farm, render_id)
    if state != "done":
        common.fail(f"bench render {render_id} {state}", code=1)
    return end_s, _errors(samples, end_s)


def _print(spec: dict, throttles: list[float], rows: list[tuple[float, list[float]]]) -> None:
    typer.echo(f"ETA accuracy: {spec['width']}x{spec['height']}x{spec['frames']}, stage-2 tiles "
               f"{spec.get('stage2_tiles') or 'none'}, workers at throttle {', '.join(f'{t:g}x' for t in throttles)}")
    typer.echo(f"{'render':<8}{'wall s':>9}{'samples':>9}{'median err':>12}{'max err':>10}{'within 20%':>12}")
    every: list[float] = []
    for i, (wall, errors) in enumerate(rows):
        every += errors
        if errors:
            inside = sum(e <= GOAL for e in errors) / len(errors)
            typer.echo(f"{i + 1:<8}{wall:>9.1f}{len(errors):>9}{statistics.median(errors):>11.1%}"
                       f"{max(errors):>10.1%}{inside:>12.0%}")
        else:
            typer.echo(f"{i + 1:<8}{wall:>9.1f}{0:>9}  (no sample past 25 %)")
    if every:
        typer.echo(f"all: median error {statistics.median(every):.1%}, {sum(e <= GOAL for e in every) / len(every):.0%} "
                   f"of {len(every)} samples within 20 %  (goal: every sample from 25 % progress within 20 %)")
