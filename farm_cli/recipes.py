"""`farm recipes`: every recipe's facts and its cost on one Mac and on four, read from the recipe records.

Why: what a recipe is for, how to pick it, what it loads and what it composes with are data in
`coordinator/plan/recipes/`; this command (and the pages `farm_cli/recipe_pages.py` writes from the
same rows) shows them with the planner's own estimate, so neither a person nor a page retypes them.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from farm_cli.options import Json

# The render each recipe is priced at: its default spec over this base (the size the recipe pages use).
BASE_SPEC: dict[str, Any] = {"prompt": "a fox crosses a snowy field", "width": 768, "height": 512, "frames": 49}
# The described Mac: the cost model's reference chip (measured, speed 1.0 in costs.CHIP_SPEED).
MAC: dict[str, Any] = {"name": "mac", "chip": "Apple M4 Pro", "memory_gb": 64, "generation": "2.5"}
MAC_WORDS = "M4 Pro 64 GB (the cost model's reference chip) with a full-size q8 LTX-2.5 pack, 10 GbE"
FLEETS = (1, 4)
NEEDS_CLIP = "needs a clip: cost shown by farm plan with one"
MEDIA_FIELDS = ("source_video", "control_video", "dub_video", "hdr_ic_lora", "audio_input")


def _flags_of_fields() -> dict[str, str]:
    """Each RenderSpec field's long flag (fields with no flag are set from another one, e.g. a clip)."""
    from protos.flags import field_flags
    from protos.spec import RenderSpec

    out: dict[str, str] = {}
    for f, flag in field_flags(RenderSpec):
        out.setdefault(f.name, flag.decls[-1])
    return out


def render_size() -> str:
    """The priced render as WxHxF."""
    return f"{BASE_SPEC['width']}x{BASE_SPEC['height']}x{BASE_SPEC['frames']}"


def estimate(recipe, macs: int) -> tuple[float | None, str | None]:
    """The planner's predicted wall seconds for the recipe's default render on `macs` described Macs
    (as `farm plan --fleet` computes it), or None and why it could not plan."""
    from coordinator.plan.graph import SpecError
    from coordinator.views.forecast import described_fleet, forecast
    from protos.spec import RenderSpec

    raw = {**BASE_SPEC, **recipe.default_spec}
    if not recipe.video:  # the audio track alone (T2A): the same length, no picture size
        raw = {k: v for k, v in raw.items() if k not in ("width", "height")}
    pack = RenderSpec.from_dict(raw).pack
    caps, slots = described_fleet([{**MAC, "count": macs}], pack)
    try:
        return round(forecast(raw, caps, slots)["total_s"], 1), None
    except SpecError as exc:
        if any(raw.get(name) for name in MEDIA_FIELDS):
            return None, NEEDS_CLIP
        return None, f"not planned: {exc}"


def recipe_row(recipe) -> dict[str, Any]:
    """One recipe's facts and costs, as `--json` prints them and the pages are written from."""
    from coordinator.plan.recipes import taken_by

    flags = _flags_of_fields()
    cost: dict[str, Any] = {}
    for macs in FLEETS:
        seconds, note = estimate(recipe, macs)
        cost[str(macs)] = seconds if note is None else note
    return {"name": recipe.name, "purpose": recipe.purpose, "flag": recipe.flag,
            "flags": [flags.get(name, f"{name} (set from a clip, no flag)") for name in recipe.fields],
            "components": list(recipe.components), "modifiers": [m.flag for m in taken_by(recipe)],
            "upstream": recipe.upstream, "wall_s": cost}


def recipe_rows() -> dict[str, Any]:
    """Every recipe in the order people read them, with what the costs were priced at."""
    from coordinator.plan.recipes import SHOWN

    return {"render": render_size(), "mac": MAC_WORDS, "unit": "s (predicted wall seconds, farm plan's cost model)",
            "recipes": [recipe_row(r) for r in SHOWN]}


def cost_words(value: float | str) -> str:
    """A cost cell: seconds, or the line saying why there is none."""
    return f"{value:.1f} s" if isinstance(value, float | int) else str(value)


def recipes(as_json: Json = False) -> None:
    """List every recipe: what it is for, how to pick it, its flags, pack components, the modifiers it
    takes, its upstream reference and its predicted cost on one Mac and on four."""
    data = recipe_rows()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(f"cost: {data['render']} default render of each recipe, predicted wall seconds on 1 and on 4 x "
               f"{data['mac']}")
    for row in data["recipes"]:
        typer.echo("")
        typer.echo(f"{row['name']}: {row['purpose']}")
        typer.echo(f"  pick it:    {row['flag']}")
        typer.echo(f"  its flags:  {', '.join(row['flags']) or '-'}")
        typer.echo(f"  components: {', '.join(row['components'])}")
        typer.echo(f"  modifiers:  {', '.join(row['modifiers']) or '-'}")
        typer.echo(f"  upstream:   {row['upstream']}")
        typer.echo(f"  cost:       1 Mac {cost_words(row['wall_s']['1'])}; 4 Macs {cost_words(row['wall_s']['4'])}")
