"""`farm plan`: what a render would do and cost on the live fleet or a described one, before queuing.

Why: a person sizing a render (or a Mac purchase) sees the stage graph, tiles, which Mac takes what,
the predicted seconds per stage and the peak per task from the farm's own planner and cost model.
"""


import json
from pathlib import Path

import typer

from farm_cli.options import Coordinator, FleetFile, Json, Token
from farm_cli.render_options import asked_render, render_options
from farm_cli.session import fail, one_line


def _fleet(fleet_file: Path | None, pack: str, coordinator: str, token: str | None) -> tuple[list, list]:
    from coordinator.views.forecast import described_fleet, live_fleet, read_fleet

    if fleet_file is not None:
        return _described(fleet_file, pack, read_fleet, described_fleet)
    from farm_cli.remote import client

    with one_line(code=1, hint=" (or plan for a described fleet with --fleet FILE)"), client(coordinator, token) as farm:
        return live_fleet(farm.workers())


def _described(path: Path, pack: str, read_fleet, described_fleet) -> tuple[list, list]:
    """A --fleet file as capabilities and slots; a file that is missing, not TOML / JSON, or whose rows
    are not workers is one line naming the file and the shape it should have (README's example)."""
    import tomllib

    from coordinator.plan.graph import SpecError

    shape = "[[workers]] tables of name, chip, memory_gb, count (one key = value per line)"
    try:
        rows = read_fleet(path)
        if not all(isinstance(r, dict) for r in rows):
            raise ValueError("a worker is not a table")
        return described_fleet(rows, pack)
    except SpecError:
        raise
    except OSError as exc:
        fail(f"--fleet {path}: {exc.strerror or exc}")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, ValueError, TypeError, AttributeError) as exc:
        fail(f"--fleet {path}: not a fleet file ({str(exc).splitlines()[0]}); give {shape}")


def _gib(n: int) -> str:
    """A peak in GiB, or MiB when it is under one GiB (the tiny pack's are), so no peak reads 0.0."""
    if not n:
        return "-"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def assumed_length_line(frames: int, frame_rate: float) -> str:
    """-f left out with --fleet: an LTX-2.5 pack's duration head picks the length only when the render
    runs, so the estimate states the length it is priced at (it used to price 25 frames silently)."""
    return (f"length: -f not given: on an LTX-2.5 pack the duration head picks it from the prompt when the "
            f"render runs; this estimate assumes {frames} frames ({frames / frame_rate:.2f} s at {frame_rate:g} "
            "fps): give -f to price another length")


def print_plan(plan: dict) -> None:
    """The plan in rows people read: one line per stage, then the total."""
    spec = plan["spec"]
    if spec.get("frames") is None:  # an LTX-2.5 render whose DurationHead picks the length first
        typer.echo("length: picked by the pack's DurationHead once the prompt is encoded; this plan is that first "
                   "phase only (give -f to plan the whole render)")
    tiled = sum(int(row["kinds"].get("decode_tile", 0)) for row in plan["stages"])  # else one decode_video
    decode = f"{plan['tiles']['decode']} ({tiled} tiles)" if tiled else "none (the clip is decoded whole)"
    typer.echo(f"{spec['width']}x{spec['height']}x{spec['frames'] or '?'} on {len(plan['workers'])} worker(s): "
               f"stage-2 tiles {plan['tiles']['stage2'] or 'none'}, decode tiles {decode}")
    kinds = [", ".join(f"{n} {k}" for k, n in row["kinds"].items()) for row in plan["stages"]]
    width = max([34, *map(len, kinds)])  # the widest row sets the column: every row lines up
    typer.echo(f"{'stage':<10} {'tasks':<{width}} {'start':>8} {'end':>8}  {'peak/task':>10}  workers")
    for row, tasks in zip(plan["stages"], kinds, strict=True):
        streamed = row.get("streamed") or {}  # tasks a small Mac runs with its DiT blocks streamed
        workers = ", ".join(f"{w}×{n}" + (f" ({streamed[w]} streamed)" if streamed.get(w) else "")
                            for w, n in row["workers"].items())
        workers += f" (sequence parallel ×{row['degree']})" if row.get("degree", 1) > 1 else ""
        typer.echo(f"{row['label']:<10} {tasks:<{width}} {row['start_s']:>7.1f}s {row['end_s']:>7.1f}s  "
                   f"{_gib(row['peak_bytes']):>10}  {workers}")
    typer.echo(f"predicted wall time: {plan['total_s']:.1f} s (cost model: coordinator/plan/costs.py; "
               "a worker's measured speeds where it has run tasks, else its chip's; lease.lua's rules, "
               "stage 1's degree from the idle Macs over 10 GbE)")


@render_options
def plan(fleet: FleetFile = None, *, coordinator: Coordinator, token: Token = None, as_json: Json = False,
         **asked) -> None:
    """Plan a render without queuing it: stages, tiles, who takes what, seconds and peak memory."""
    from coordinator.admit.media_check import clip_frames
    from coordinator.plan.graph import SpecError
    from coordinator.plan.render import DEFAULT_FRAMES
    from coordinator.plan.resolved import RenderPlan
    from coordinator.views.forecast import forecast

    render = asked_render(asked, planning=True)
    spec = render.spec
    pack = spec.pack
    with one_line(SpecError):
        asked_plan = RenderPlan(spec)
        known = asked_plan.resolve(**clip_frames(asked_plan, render.media_files.get))  # -f from the clip
        caps, slots = _fleet(fleet, pack, coordinator, token)
        assumed = fleet is not None and known.frames is None and not (  # where no other rule sets it
            spec.auto_duration or spec.hdr_ic_lora or spec.control_video or spec.dub_video)
        result = forecast(known.resolve(frames=DEFAULT_FRAMES) if assumed else known, caps, slots)
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
    else:
        if assumed:  # a described fleet has no duration head to ask: the estimate is priced at one length
            typer.echo(assumed_length_line(DEFAULT_FRAMES, spec.frame_rate))
        print_plan(result)
        if spec.loras:
            from coordinator.plan.costs import lora_fuse_seconds

            seconds = lora_fuse_seconds({"loras": spec.loras, "lora_mode": spec.lora_mode})
            typer.echo(f"LoRA set: {len(spec.loras)} {spec.lora_mode}; a worker without it warm spends ~{seconds:.0f} s "
                       "(reference seconds) building it before its first DiT task, counted in the times above")
        print_guidance(spec)


def print_guidance(spec) -> None:
    """A guided recipe's passes per step (each a task any worker takes at once)."""
    from coordinator.plan.guidance import RES_2S, recipe, rounds_of
    from coordinator.plan.recipes import recipe_for
    from coordinator.plan.resolved import RenderPlan

    plan = RenderPlan(spec)
    rule = recipe_for(plan).guidance
    rec = recipe(plan, rule)
    if rec is None:
        return
    rounds = "2 evaluations x " if rec.sampler == RES_2S else ""
    typer.echo(f"guidance: {len(rec.sigmas) - 1} steps x {rounds}{len(rec.passes)} passes ({', '.join(rec.passes)}) "
               f"= {rec.forwards_per_step()} forwards per step, combined on the coordinator")
    planned = rounds_of(rec, ("audio_",) if rule.audio_only else ("", "audio_"))
    if rec.bins or any(r.held for r in planned):  # skip steps / a schedule: rounds differ
        counts = [len(r.passes) for r in planned]
        typer.echo(f"  skip steps / --guidance-schedule: {sum(counts)} pass tasks over {len(planned)} rounds "
                   f"({'+'.join(map(str, counts))})")
    from coordinator.plan.guided_render import stage2_line

    line = stage2_line(RenderPlan(spec), rec)
    if line:
        typer.echo(line)
