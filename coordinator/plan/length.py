"""A 2.5 render without -f: its length is picked on the farm before the stage graph is planned. Pure.

Upstream's pipelines predict `num_frames` from the prompt's connector tokens (DurationPredictor) before
any stage runs. The farm plans a render in two phases: at submit, only the text task, the DurationHead
task (a model, so a worker runs it) and a coordinator task that waits for its answer; that task then
plans the rest with the picked length (`planner.continue_render`) and records it, the spec and the new
tasks in one Redis script (`set_length.lua`), before stage 1 can start. The rest is exactly the graph
`farm render --local` plans once it has predicted the same length from the same text outputs.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from coordinator.plan import costs
from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import COORDINATOR, SpecError, expect, ref, task
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.components import missing_line
from ltx_engine.rules.duration import range_problem, shortest_frames
from ltx_engine.rules.generation import LTX_25

PLAN_KIND = "plan_length"     # the coordinator task that plans the rest of the graph
DURATION_HEAD = "duration_head"
SETTLED = ("generation", "text_encoder", "pack_bytes")  # what submit resolves that phase 2 keeps


def length_pending(spec: RenderPlan) -> bool:
    """-f left out on a pack known to be LTX-2.5: its DurationHead picks the length on the farm."""
    return spec.frames is None and spec.generation == LTX_25


def probe_spec(spec: RenderPlan, fleet: Fleet) -> RenderPlan:
    """The spec at the shortest length the head can pick, for the checks that need a length at submit
    (the picked length is checked again before the rest is queued; an image's frame only then). A
    fleet that describes the pack without a DurationHead refuses the render here, in one line."""
    components = fleet.components(spec.pack)
    if components is not None and DURATION_HEAD not in components:
        raise no_head(spec.pack)
    asked = spec.spec
    # the images' frames are checked against the picked length, with the rest of phase 2
    return spec.with_spec(replace(asked, frames=shortest_frames(asked.frame_rate, *seconds_range(spec)), images=()))


def seconds_range(spec: RenderPlan) -> tuple[float, ...]:
    """The head's (min, max) seconds that `--auto-duration MIN:MAX` asked for; () for the head's own."""
    bounds = spec.auto_duration
    return (float(bounds[0]), float(bounds[1])) if bounds else ()


def check_auto_duration(spec: RenderPlan) -> None:
    """`--auto-duration` bounds the head's pick: refused with -f (asked, not the head's pick), on a pack not
    known to be LTX-2.5, and for a range outside the head's own or without an 8k+1 length at the rate."""
    bounds = seconds_range(spec)
    if not bounds:
        return
    problem = range_problem(*bounds, spec.frame_rate)
    if problem:
        raise SpecError(problem)
    if spec.spec.frames is not None:
        raise SpecError("--auto-duration bounds the length the duration head picks: give it or -f/--frames, not both")
    if spec.generation != LTX_25:
        raise SpecError(f"--auto-duration needs an LTX-2.5 pack (its duration_head picks the length); pack "
                        f"{spec.pack!r} is not known to be one")


def head_params(spec: RenderPlan) -> dict:
    """The DurationHead task's params (`farm render --local` runs it with the same): the pack, the rate and,
    with --auto-duration, the range its seconds are clamped to."""
    bounds = seconds_range(spec)
    extra = {"min_seconds": bounds[0], "max_seconds": bounds[1]} if bounds else {}
    return {"pack": spec.pack, "fps": spec.frame_rate, **extra}


def no_head(pack: str) -> SpecError:
    """The one line for a left-out length on an LTX-2.5 pack without its DurationHead."""
    return SpecError(f"{missing_line(DURATION_HEAD, pack)} (LTX-2.5 picks a left-out length with it), "
                     "or give -f/--frames")


def settled(probe: RenderPlan) -> dict:
    """What validating the probe resolved that does not depend on the length (phase 1 keeps it)."""
    return {k: getattr(probe.resolved, k) for k in SETTLED}


def plan_length_phase(rid: str, spec: RenderPlan, text: dict) -> list[dict]:
    """Phase 1: the text task, the DurationHead on its outputs, and the coordinator task that plans the
    rest from the spec as it stands now (before any length-dependent resolution)."""
    ctx = {k: ref(text["id"], k) for k in ("video_context", "audio_context")}
    head = task(rid, "length.head", "predict_duration", {
        **head_params(spec), "expect": {"seconds": expect("float32", 1), "frames": expect("int32", 1)}}, ctx)
    plan = task(rid, "length.plan", PLAN_KIND, {"spec": spec.as_dict(), "expect": {"frames": expect("int32", 1)}},
                {k: ref(head["id"], k) for k in ("seconds", "frames")}, capability=COORDINATOR)
    tasks = [text, head, plan]
    shortest = shortest_frames(spec.frame_rate, *seconds_range(spec))
    costs.annotate(tasks, spec.resolve(frames=shortest))  # their costs need no length
    return tasks


def picked(outputs: dict[str, np.ndarray]) -> tuple[int, float]:
    """(frames, seconds) from a DurationHead task's outputs, seconds as the render records them."""
    return int(outputs["frames"][0]), round(float(outputs["seconds"][0]), 4)


def length_line(frames: int, seconds: float, frame_rate: float) -> str:
    """The line `farm render --local`, `submit --wait` and `farm watch` show once the length is picked."""
    return f"duration head: {seconds:.2f} s predicted -> {frames} frames at {frame_rate:g} fps"
