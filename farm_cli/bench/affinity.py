"""`farm bench affinity`: model loads of a mixed queue with warm-model affinity on and off, in interleaved pairs.

Why: a worker whose next task needs models it does not hold loads them (seconds on a real pack);
lease.lua's affinity lets it take instead a queued task whose models it holds warm. Each pair queues
the same mixed batch twice on one farm — renders whose text, stage-1/2, upsample, decode and audio
tasks load different models — with the coordinator's affinity policy on and off (set_policy.lua),
alternating which goes first. The workers' model budget (FARM_MODEL_BUDGET_MB) is small (3 MB holds
about two of the tiny pack's models), so a change of model is a load, as on a Mac whose memory holds one
kind's models at a time. Loads are counted from
what each worker reports after every task (metrics.models): a model warm after a task that was not
after that worker's previous task was loaded by it.
"""

from __future__ import annotations

import statistics
import time

import typer

from farm_cli.bench.dealing import throttled_fleet
from protos.states import TERMINAL

PROMPTS = ("a fox in snow", "a paper boat on a pond", "a city at night", "waves on a rock", "a red kite",
           "rain on a window", "a cat asleep", "a train in fog")


def model_loads(store, render_ids: list[str], last: dict[str, set[str]]) -> int:
    """Models the workers loaded for these renders, in lease order; `last`: each worker's warm models
    after its previous task (carried from run to run)."""
    tasks = [t for rid in render_ids for t in store.render_tasks(rid)
             if t["state"] == "done" and t.get("worker") and isinstance((t.get("metrics") or {}).get("models"), list)]
    loads = 0
    for t in sorted(tasks, key=lambda t: t["leased_ms"]):
        models = set(t["metrics"]["models"])
        loads += len(models - last.get(t["worker"], set()))
        last[t["worker"]] = models
    return loads


def _batch(farm, spec: dict, renders: int) -> list[str]:
    """Queue the mixed batch at once, then wait for all of it."""
    ids = [farm.submit({**spec, "prompt": PROMPTS[i % len(PROMPTS)], "seed": i + 1}) for i in range(renders)]
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline and any(farm.get(r).get("state") not in TERMINAL
                                              for r in ids):
        time.sleep(0.5)
    return ids


def run(spec: dict, workers: int, renders: int, pairs: int, budget_mb: float, data) -> None:
    """Warm up, then `pairs` interleaved pairs of the batch with affinity on/off; print loads side by side."""
    rows, last = [], {}
    env = {"FARM_MODEL_BUDGET_MB": str(budget_mb)}
    with throttled_fleet(spec, [1.0] * workers, data, env) as (farm, store):
        model_loads(store, _batch(farm, spec, workers), last)  # each worker loads the text encoder once
        for i in range(pairs):
            side = {}
            for affinity in (("1", "0") if i % 2 == 0 else ("0", "1")):
                store.set_policy(affinity=affinity)
                t0 = time.monotonic()
                ids = _batch(farm, spec, renders)
                wall = time.monotonic() - t0
                failed = [r for r in ids if farm.get(r).get("state") != "done"]
                if failed:
                    typer.echo(f"renders not done: {', '.join(failed)}", err=True)
                side[affinity] = (model_loads(store, ids, last), wall)
            rows.append(side)
    _print(spec, workers, renders, budget_mb, rows)


def _print(spec: dict, workers: int, renders: int, budget_mb: float, rows: list[dict]) -> None:
    typer.echo(f"Affinity: {renders} renders queued at once ({spec['width']}x{spec['height']}x{spec['frames']}, "
               f"different prompts), {workers} workers, model budget {budget_mb:g} MB each")
    typer.echo(f"{'pair':<6}{'loads on':>10}{'loads off':>11}{'on/off':>8}{'wall on s':>11}{'wall off s':>12}")
    ratios = []
    for i, side in enumerate(rows):
        (on, wall_on), (off, wall_off) = side["1"], side["0"]
        ratios.append(on / off if off else 1.0)
        typer.echo(f"{i + 1:<6}{on:>10}{off:>11}{ratios[-1]:>8.2f}{wall_on:>11.1f}{wall_off:>12.1f}")
    typer.echo(f"loads on/off: median {statistics.median(ratios):.2f} (spread {min(ratios):.2f}-{max(ratios):.2f}); "
               "goal < 1 (affinity loads fewer models)")
