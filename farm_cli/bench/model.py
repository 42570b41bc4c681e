"""`farm bench model`: the modelled speedup of a fleet of Macs over one, from the calibrated cost model.

Why: before buying or wiring Macs, a studio wants to know what four buy over one for the render it
makes most (latency) and for a queue of them (throughput). The headline runs the same stage 2 on both
sides (the fleet's tiles, `auto` resolved against the fleet; the decode is auto's on each side: tiled
on the fleet, one task on one Mac), so the ratio is what the Macs buy; one Mac on its own
untiled plan (another plan, another length) is a second line that says so. Nothing runs: the farm's
own planner cuts the render, coordinator/plan/costs.py
prices every task, and coordinator/plan/lease_sim.py runs lease.lua's rules over them (queue order,
memory, dealing, affinity, backfilling, and stage 1 sequence parallel at the degree the idle workers
give at lease time), once per link between the Macs.
"""

from __future__ import annotations

from collections import Counter

from coordinator.plan import costs, placement, sp_degree
from coordinator.plan.graph import latent_frames
from coordinator.plan.recipes import BY_NAME, takes
from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from coordinator.plan.resolved import RenderPlan
from coordinator.views.forecast import described_fleet
from protos.kinds import TaskKind

SPEC = {"prompt": "bench", "height": 1088, "width": 1920, "frames": 121, "pack": "ltx-2.3-mlx-q8"}
LINKS = (("10 GbE", sp_degree.LINKS["10gbe"]), ("Thunderbolt 5", sp_degree.LINKS["thunderbolt5"]))
GOALS = {"10 GbE": 3.2, "Thunderbolt 5": 3.5, "queue": 3.9}  # one render per link, a queue of 8; 4 M1 Max
GUIDED = ("two-stage", "one-stage")  # the dev recipes (4 passes a step: cond, uncond, STG, modality)


def _plan(spec: dict, macs: int, chip: str, memory_gb: float, render: str) -> tuple[list[dict], list, RenderPlan]:
    caps, slots = described_fleet(
        [{"name": "mac", "chip": chip, "memory_gb": memory_gb, "count": macs}], spec["pack"]
    )
    s = validate_spec(normalize_spec(dict(spec)), caps)
    return plan_render(s, render), slots, s


def _fleet_tiles(spec: dict, macs: int, chip: str, memory_gb: float) -> dict:
    """The spec with its stage-2 tiles as the fleet's planner resolves them (`auto` made counts), so the
    one-Mac side runs the fleet's plan, not its own auto."""
    if spec.get("stage2_tiles") is None:
        return spec
    return {**spec, "stage2_tiles": _plan(spec, macs, chip, memory_gb, "tiles")[2].stage2_tiles}


def _run(tasks: list[dict], slots: list, sp: placement.SpRule | None) -> list[placement.Placed]:
    return placement.simulate(tasks, slots, sp=sp)


def _wall(placed: list[placement.Placed], mux: float) -> float:
    """The render's (or the queue's) end: its last task, then the coordinator's assembly after it (`mux`,
    the plan's `assemble_s` at the reference speed, as the live ETA adds it); the same on both sides."""
    return max((p.end for p in placed), default=0.0) + mux


def _queue_tasks(spec: dict, macs: int, chip: str, memory_gb: float, n: int) -> tuple[list[dict], list]:
    """`n` such renders queued at once (seeds differ), and the fleet."""
    tasks, slots = [], []
    for i in range(n):
        planned, slots, _ = _plan({**spec, "seed": i + 1}, macs, chip, memory_gb, f"r{i}")
        tasks += planned
    return tasks, slots


def redundancy(spec: RenderPlan) -> float:
    """Stage-2 tile tokens (overlaps counted in every tile) over the untiled tokens."""
    tiles = [t for t in plan_render(spec, "x") if t["kind"] == "transformer_forward"]
    steps = len({t["params"]["step"] for t in tiles}) or 1
    tokens = sum(_tokens(t["params"]) for t in tiles) / steps
    whole = latent_frames(spec.frames) * (spec.height // 32) * (spec.width // 32)
    return tokens / whole


def _tokens(params: dict) -> int:
    iv = params["tile"]
    return (
        (iv["frames"][1] - iv["frames"][0])
        * (iv["height"][1] - iv["height"][0])
        * (iv["width"][1] - iv["width"][0])
    )


def degrees(placed: list[placement.Placed]) -> str:
    """Stage 1's degrees at lease time, e.g. '4' or '1×7, 4×1'."""
    used = Counter(p.degree for p in placed if p.kind == TaskKind.DENOISE_STAGE1)
    if len(used) == 1 and sum(used.values()) == 1:
        return str(next(iter(used)))
    return ", ".join(f"{k}×{n}" for k, n in sorted(used.items()))


def _bound(placed: list[placement.Placed], macs: int, goal: float, t1: float, mux: float) -> str:
    """What keeps a fleet figure under its goal: its serial stage 1, or idle Macs, or the work itself."""
    wall = _wall(placed, mux)
    busy = sum((p.end - p.start) * (1 + len(p.gang)) for p in placed if p.slot != placement.COORDINATOR_SLOT)
    s1 = sum(p.end - p.start for p in placed if p.kind == TaskKind.DENOISE_STAGE1)
    return (
        f"bounded by: {busy / macs:.0f} s of work per Mac, {s1:.0f} s in stage 1, Macs busy "
        f"{busy / (macs * wall):.0%} of the wall, the assembly after the last task {mux:.1f} s; the goal needs a "
        f"wall of {t1 / goal:.0f} s"
    )


def _row(label: str, t1: float, placed: list[placement.Placed], macs: int, goal: float | None,
         mux: float) -> list[str]:
    tn = _wall(placed, mux)
    mark = "" if goal is None else (f"  goal ≥ {goal:g}x: " + ("met" if t1 / tn >= goal else "NOT met"))
    lines = [f"{label:28}{t1:>10.0f}{tn:>10.0f}{t1 / tn:>8.2f}x  stage 1 at degree {degrees(placed)}{mark}"]
    if goal is not None and t1 / tn < goal:
        lines.append("    " + _bound(placed, macs, goal, t1, mux))
    return lines


def _distilled(macs: int, chip: str, memory_gb: float, queue: int, tiles: str) -> tuple[list[str], RenderPlan]:
    """Per link: the fleet's plan on N Macs against the same plan on one (the headline), then against one
    Mac on its own untiled plan (another plan: a second line that says what differs)."""
    one = {**SPEC, "stage2_tiles": None, "decode_tiles": "off"}
    many = _fleet_tiles({**SPEC, "stage2_tiles": tiles, "decode_tiles": "auto"}, macs, chip, memory_gb)
    own_tasks, own_slots, own_spec = _plan(one, 1, chip, memory_gb, "one")
    mux = float(own_spec.assemble_s or 0.0)  # the same frames on every side: the same assembly
    own1 = _wall(_run(own_tasks, own_slots, None), mux)
    own_q = _wall(_run(*_queue_tasks(one, 1, chip, memory_gb, queue), None), mux)
    t1 = _wall(_run(*_plan(many, 1, chip, memory_gb, "same")[:2], None), mux)  # the fleet's plan on one Mac
    q1 = _wall(_run(*_queue_tasks(many, 1, chip, memory_gb, queue), None), mux)
    lines = []
    for name, bw in LINKS:
        sp = placement.SpRule(bw)
        fleet_tasks, fleet_slots, resolved = _plan(many, macs, chip, memory_gb, "many")
        alone, queued = (
            _run(fleet_tasks, fleet_slots, sp),
            _run(*_queue_tasks(many, macs, chip, memory_gb, queue), sp),
        )
        lines.append(f"linked by {name} ({bw / 1e9:g} GB/s):")
        lines += _row("  one render, wall s", t1, alone, macs, GOALS[name], mux)
        lines += _row(f"  queue of {queue}, wall s", q1, queued, macs, GOALS["queue"], mux)
        lines.append(
            f"    against 1 Mac on another plan (stage 2 untiled, 3 steps; one decode: {own1:.0f} s, queue "
            f"{own_q:.0f} s): {own1 / _wall(alone, mux):.2f}x one render, {own_q / _wall(queued, mux):.2f}x the queue"
        )
    return lines, resolved


def _guided(macs: int, chip: str, memory_gb: float, tiles: str) -> list[str]:
    """The dev recipes with the cost model's guidance_pass entries: every pass of a step on its own Mac."""
    lines = []
    for recipe_name in GUIDED:
        spec = {**SPEC, "pipeline": recipe_name}
        tiled = takes(BY_NAME[recipe_name], "--stage2-tiles")  # the recipe's fact: its stage 2 tiles
        fleet = {**spec, "stage2_tiles": tiles, "decode_tiles": "auto"} if tiled else {**spec, "decode_tiles": "auto"}
        try:
            fleet = _fleet_tiles(fleet, macs, chip, memory_gb)
            own_tasks, own_slots, own_spec = _plan({**spec, "decode_tiles": "off"}, 1, chip, memory_gb, "g1")
            same_tasks, same_slots, _ = _plan(fleet, 1, chip, memory_gb, "gs")
            fleet_tasks, fleet_slots, _ = _plan(fleet, macs, chip, memory_gb, "gn")
        except ValueError as exc:  # SpecError: this recipe cannot run on this fleet
            lines.append(f"  {recipe_name}: {exc}")
            continue
        passes = sorted({t["id"].rsplit(".", 1)[-1] for t in fleet_tasks if t["kind"] == "guidance_pass"})
        mux = float(own_spec.assemble_s or 0.0)
        t1, own = _wall(_run(same_tasks, same_slots, None), mux), _wall(_run(own_tasks, own_slots, None), mux)
        tn = _wall(_run(fleet_tasks, fleet_slots, placement.SpRule(LINKS[0][1])), mux)
        lines.append(
            f"  {recipe_name} ({len(passes)} passes a step: {', '.join(passes)}): the same plan {t1:.0f} s on "
            f"1 Mac, {tn:.0f} s on {macs}: {t1 / tn:.2f}x (against 1 Mac on its own untiled plan, {own:.0f} s: "
            f"{own / tn:.2f}x)"
        )
    return lines


LONG = {**SPEC, "height": 704, "width": 1280, "frames": 721, "chunked": True}  # 30 s at 24 fps, 97-frame windows


def _long(macs: int, chip: str, memory_gb: float, tiles: str) -> list[str]:
    """A 30-second clip in chunked windows, each carry's schedule: the decoded carry (upstream's) chains
    every window through its decode; the latent carry (ours) lets window k+1's stage 1 start while window
    k's stage 2 and decode run on other Macs."""
    lines = []
    for carry in ("decoded", "latent"):
        spec = _fleet_tiles({**LONG, "chunk_carry": carry, "stage2_tiles": tiles, "decode_tiles": "auto"}, macs, chip,
                            memory_gb)
        one_tasks, one_slots, resolved = _plan(spec, 1, chip, memory_gb, "long1")
        mux = float(resolved.assemble_s or 0.0)
        t1 = _wall(_run(one_tasks, one_slots, None), mux)
        tn = _wall(_run(*_plan(spec, macs, chip, memory_gb, "longn")[:2], placement.SpRule(LINKS[0][1])), mux)
        lines.append(f"  {carry} carry: {t1:.0f} s on 1 Mac, {tn:.0f} s on {macs}: {t1 / tn:.2f}x")
    return lines


def model(macs: int, chip: str, memory_gb: float, queue: int, tiles: str) -> list[str]:
    """The report's lines: one Mac vs the fleet, one render and a queue, per link; the guided recipes;
    then the assumptions."""
    distilled, resolved = _distilled(macs, chip, memory_gb, queue, tiles)
    tokens = latent_frames(SPEC["frames"]) * (SPEC["height"] // 64) * (SPEC["width"] // 64)
    return [
        f"{SPEC['width']}x{SPEC['height']}x{SPEC['frames']} distilled, {chip} {memory_gb:g} GB, the same plan "
        f"(the fleet's: stage 2 tiled {resolved.stage2_tiles}, 2 steps) on 1 Mac and on {macs}:",
        f"{'':28}{'1 Mac':>10}{f'{macs} Macs':>10}{'speedup':>9}",
        *distilled,
        f"guided recipes, one render (stage 1 passes and guide steps as planned; {LINKS[0][0]}):",
        *_guided(macs, chip, memory_gb, tiles),
        f"a 30-second clip, {LONG['width']}x{LONG['height']}x{LONG['frames']} --chunked (97-frame windows, a 25-frame "
        f"carry; the same plan on 1 Mac and on {macs}; {LINKS[0][0]}):",
        *_long(macs, chip, memory_gb, tiles),
        "assumptions:",
        f"- stage 2 tiled {resolved.stage2_tiles} (TDP schedule, 2 steps) on 1 Mac and on the fleet alike; "
        f"tile redundancy {redundancy(resolved):.2f}x the untiled tokens; the second line per link: one Mac on "
        "its own plan (stage 2 untiled, 3 steps; one decode)",
        f"- decode: auto's choice on each side: tiles {resolved.decode_tiles} on the fleet (decode.fleet_sizes: "
        "the split whose tiles, dealt to the Macs, end first), one decode on 1 Mac",
        f"- stage 1 ({tokens} tokens) sequence parallel, its degree chosen at lease time from the idle Macs "
        "(sp_degree.stage1_degree: the shortest modelled step, one more Mac only for 5 % of it); a gang "
        f"reservation fills from the Macs that ask within {sp_degree.GANG_WINDOW_S:g} s; per step compute/k + "
        "K/V all-gathers (48 layers, bf16: self, text, video->audio) over the link less the compute behind each "
        "(sp_plan.OVERLAP_SHARES)",
        "- DiT forward 5.03e-3·N + 1.66e-7·N² + 0.6 s on an M4 Pro (seed 003 steps), chip speed "
        f"{costs.chip_speed(chip):g}x; decode 3.5e-7 s per pixel·frame; text 6 s",
        "- models load once per Mac (2 GB/s); tile inputs and outputs move for free; the coordinator's blend "
        f"and sampler step 0.05 s; the assembly after the last task on both sides ({resolved.assemble_s:.1f} s: "
        "H.264 of the frames no decode tile left final earlier, the AAC and the mux)",
        "- lease.lua's rules: queue order (priority, then when ready), the first free Mac that can hold a task "
        "takes it (75 % of its memory usable, else streamed), tiles dealt speed-aware, warm-model affinity, "
        "later tasks backfill a Mac that cannot take the first",
    ]
