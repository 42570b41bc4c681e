"""The render spec is one frozen record, built and checked once where it enters, never rewritten:
planning returns what it resolves in a separate record and leaves the spec as it was asked."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from coordinator.plan.render import plan_render, validate_spec
from coordinator.plan.resolved import RenderPlan, Resolved
from protos.spec import RenderSpec, SpecError

ROOT = Path(__file__).resolve().parents[2]
FLEET = [{"packs": ["p"], "memory_bytes": 2**36, "pack_bytes": {"p": 26 * 2**30},
          "pack_generation": {"p": "2.5"}, "pack_features": {"p": ["temporal_upscaler", "keyframes"]}}] * 2


def test_the_spec_is_frozen_and_holds_tuples():
    spec = RenderSpec.from_dict({"prompt": "a fox", "pack": "p", "frames": 49, "stage2_sigmas": [0.9, 0.5, 0.0],
                                 "image": {"blob": "a" * 64, "frame": 2, "strength": 0.5}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.frames = 25
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.images[0].frame = 0
    assert isinstance(spec.images, tuple) and spec.images[0].frame == 2  # an older client's `image`: images[0]
    assert spec.stage2_sigmas == (0.9, 0.5, 0.0) and not hasattr(spec, "__dict__")  # slots, tuples
    plan = validate_spec(spec, FLEET)
    with pytest.raises(TypeError):
        plan["frames"] = 25
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.resolved.frames = 25


@pytest.mark.parametrize("raw", [
    {"prompt": "a fox", "pack": "p"},  # the DurationHead picks the length: phase 1 only
    {"prompt": "a fox", "pack": "p", "frames": 49, "stage2_tiles": "auto", "height": 512, "width": 768},
    {"prompt": "a fox", "pack": "p", "frames": 25, "temporal_upscalings": 1, "decode_tiles": "auto"},
])
def test_planning_does_not_change_the_spec(raw):
    spec = RenderSpec.from_dict(raw)
    before = dataclasses.replace(spec)
    asked = spec.to_dict()
    plan = validate_spec(spec, FLEET)
    plan_render(plan, "r")
    assert spec == before and spec.to_dict() == asked and plan.spec is spec
    assert isinstance(plan, RenderPlan) and isinstance(plan.resolved, Resolved)
    assert plan.resolved.generation == "2.5" and plan.resolved.pack_bytes == 26 * 2**30  # resolved apart


def test_unknown_fields_are_refused_in_one_line_and_resolved_ones_dropped():
    with pytest.raises(SpecError, match="^unknown spec field 'colour'$"):
        RenderSpec.from_dict({"prompt": "a fox", "colour": "red"})
    assert RenderSpec.from_dict({"prompt": "a fox", "generation": "2.5", "predicted_seconds": 1.0}) == \
        RenderSpec(prompt="a fox")  # what an older client sends back out of a recorded spec


def _spec_writes(path: Path) -> list[str]:
    """`spec[...] = ...`, `spec.x = ...` and `spec.update(...)` on a name called spec."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AugAssign | ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Subscript | ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "spec":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "update", "setdefault", "pop") and isinstance(node.func.value, ast.Name) and node.func.value.id == "spec"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_module_writes_into_a_spec():
    files = [*sorted((ROOT / "coordinator").rglob("*.py")), ROOT / "farm_cli" / "local.py"]
    assert [w for f in files for w in _spec_writes(f)] == []


def test_the_plan_reads_by_attribute_resolved_first_and_back_from_its_stored_view():
    plan = validate_spec(RenderSpec.from_dict({"prompt": "a fox", "pack": "p", "frames": 49, "dfr": True,
                                               "stage2_sigmas": [0.9, 0.5, 0.0]}), FLEET)
    assert plan.frames == 49 and plan.generation == "2.5" and plan.output_frames == plan.resolved.output_frames
    assert plan.stage2_sigmas == (0.9, 0.5, 0.0)  # typed, as the spec holds it (the stored view: a list)
    assert plan.resolve(frames=97).frames == 97 and plan.frames == 49  # a view: the plan is unchanged
    asked = validate_spec(RenderSpec.from_dict({"prompt": "a fox", "pack": "p"}), [])
    assert asked.predicted_seconds is None and asked.steps is None  # neither asked nor decided: None
    with pytest.raises(AttributeError):
        asked.no_such_field  # noqa: B018
    again = RenderPlan.from_stored(plan.as_dict())
    assert again.as_dict() == plan.as_dict() and again.output_fps == plan.output_fps


def test_the_fleet_answers_the_planners_questions_once_typed():
    from coordinator.plan.fleet import Fleet

    fleet = Fleet.of([*FLEET, {"packs": ["q"], "memory_bytes": 2**30, "text_encoders": {"gemma": 1},
                               "pack_components": {"q": ["transformer"]}, "pack_problems": {"q": {"pack": "why"}}}])
    assert Fleet.of(fleet) is fleet and len(fleet.holders("p")) == 2 and not Fleet()
    assert fleet.holders("p").pack_bytes("p") == 26 * 2**30 and fleet.pack_bytes("q") is None
    assert fleet.generations("p") == {"2.5"} and fleet.features("p") == {"temporal_upscaler", "keyframes"}
    assert fleet.components("p") is None and fleet.components("q") == {"transformer"}
    assert fleet.problem("q", "vae_decoder") == "why" and fleet.text_encoders() == {"gemma"}
    assert fleet.holders("q").largest_memory() == 2**30 and fleet.largest_memory() == 2**36
