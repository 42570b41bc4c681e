"""`farm plan`: what a render would do and cost on the live fleet or a described one, before queuing.

Why: a person sizing a render (or a Mac purchase) sees the stage graph, tiles, which Mac takes what,
the predicted seconds per stage and the peak per task from the farm's own planner and cost model.
"""


import json
from pathlib import Path

import typer

from farm_cli.options import (
    SPEC,
    Coordinator,
    DecodeTiles,
    FleetFile,
    FrameRate,
    Frames,
    GeneratedKeyframes,
    Height,
    Image,
    ImageBinding,
    ImageCrf,
    Json,
    NoAudio,
    PackRef,
    Prompt,
    Seed,
    Stage2Sigmas,
    Stage2Tiles,
    TemporalUpscalings,
    TextEncoder,
    TileOverlap,
    Token,
    Width,
)
from farm_cli.session import one_line


def _fleet(fleet_file: Path | None, pack: str, coordinator: str, token: str | None) -> tuple[list, list]:
    from coordinator.plan.forecast import described_fleet, live_fleet, read_fleet

    if fleet_file is not None:
        return described_fleet(read_fleet(fleet_file), pack)
    from farm_cli.remote import client

    with one_line(code=1, hint=" (or plan for a described fleet with --fleet FILE)"), client(coordinator, token) as farm:
        return live_fleet(farm.workers())


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n else "-"


def print_plan(plan: dict) -> None:
    """The plan in rows people read: one line per stage, then the total."""
    spec = plan["spec"]
    if spec.get("frames") is None:  # an LTX-2.5 render whose DurationHead picks the length first
        typer.echo("length: picked by the pack's DurationHead once the prompt is encoded; this plan is that first "
                   "phase only (give -f to plan the whole render)")
    typer.echo(f"{spec['width']}x{spec['height']}x{spec['frames'] or '?'} on {len(plan['workers'])} worker(s): "
               f"stage-2 tiles {plan['tiles']['stage2'] or 'none'}, decode tiles {plan['tiles']['decode']}")
    typer.echo(f"{'stage':<10} {'tasks':<34} {'start':>8} {'end':>8}  {'peak/task':>10}  workers")
    for row in plan["stages"]:
        kinds = ", ".join(f"{n} {k}" for k, n in row["kinds"].items())
        workers = ", ".join(f"{w}×{n}" for w, n in row["workers"].items())
        typer.echo(f"{row['label']:<10} {kinds:<34} {row['start_s']:>7.1f}s {row['end_s']:>7.1f}s  "
                   f"{_gib(row['peak_bytes']):>10}  {workers}")
    typer.echo(f"predicted wall time: {plan['total_s']:.1f} s (cost model: coordinator/plan/costs.py; "
               "a worker's measured speeds where it has run tasks, else its chip's)")


def plan(prompt: Prompt = "", height: Height = SPEC.height, width: Width = SPEC.width, frames: Frames = None,
         frame_rate: FrameRate = SPEC.frame_rate, seed: Seed = SPEC.seed, pack: PackRef = SPEC.pack, image: Image = None, image_binding: ImageBinding = None, image_crf: ImageCrf = None, num_generated_keyframes: GeneratedKeyframes = 0,
         no_audio: NoAudio = False, stage2_tiles: Stage2Tiles = None, tile_overlap: TileOverlap = SPEC.tile_overlap,
         stage2_sigmas: Stage2Sigmas = None, temporal_upscalings: TemporalUpscalings = SPEC.temporal_upscalings,
         decode_tiles: DecodeTiles = SPEC.decode_tiles, text_encoder: TextEncoder = None, fleet: FleetFile = None,
         *, coordinator: Coordinator, token: Token = None,
         as_json: Json = False) -> None:
    """Plan a render without queuing it: stages, tiles, who takes what, seconds and peak memory."""
    from coordinator.plan.forecast import forecast
    from coordinator.plan.graph import SpecError
    from farm_cli.spec import cli_spec

    spec, _pixels = cli_spec(prompt=prompt or "plan", height=height, width=width, frames=frames,
                             frame_rate=frame_rate, seed=seed, pack=pack, image=image, image_binding=image_binding, image_crf=image_crf, num_generated_keyframes=num_generated_keyframes, no_audio=no_audio,
                             stage2_tiles=stage2_tiles, tile_overlap=tile_overlap, stage2_sigmas=stage2_sigmas,
                             temporal_upscalings=temporal_upscalings, decode_tiles=decode_tiles,
                             text_encoder=text_encoder, image_blob="plan")
    with one_line(SpecError):
        caps, slots = _fleet(fleet, pack, coordinator, token)
        result = forecast(spec, caps, slots)
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
    else:
        print_plan(result)
