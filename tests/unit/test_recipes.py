"""The recipe registry (coordinator/plan/recipes/): each recipe picked by its own default spec, its
declared components the ones its graph loads, the modifier table's one-line refusals, and every
recipe's own check run with its defaults against the tiny packs (2.3, 2.5, dev-only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.plan.graph import SpecError
from coordinator.plan.recipes import (
    BY_NAME,
    MODIFIERS,
    RECIPES,
    SHOWN,
    PackFacts,
    check_recipe_spec,
    recipe_for,
)
from coordinator.plan.recipes.modifiers import ALL, taken_by
from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from coordinator.plan.resolved import RenderPlan, Resolved
from ltx_engine.rules.components import render_components
from protos.spec import RenderSpec
from tests.session_fixtures import link_packs

BASE = {"prompt": "a fox", "frames": 25}


def _default(recipe, **extra) -> RenderPlan:
    return normalize_spec({**BASE, **recipe.default_spec, **extra})


def test_the_registry_names_each_recipe_once_and_shows_them_all():
    assert len(BY_NAME) == len(RECIPES) == len(SHOWN) and set(BY_NAME) == set(ALL) == {r.name for r in SHOWN}
    assert all(set(m.recipes) <= set(ALL) and m.recipes for m in MODIFIERS)
    assert len({m.flag for m in MODIFIERS}) == len(MODIFIERS)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_each_recipe_is_picked_by_its_default_spec_and_declares_what_it_loads(recipe):
    spec = _default(recipe)
    assert recipe_for(spec) is recipe
    assert recipe.components == render_components(spec.as_dict(), recipe.dits, recipe.video), recipe.name
    assert recipe.purpose and recipe.upstream and "\n" not in recipe.purpose


def test_facts_read_from_the_recipe():
    assert [r.name for r in RECIPES if r.guided] == ["retake-dev", "extend-dev", "one-stage", "two-stage",
                                                      "two-stage-hq", "t2a"]
    assert {r.name for r in RECIPES if not r.two_stage} == {"one-stage", "retake", "retake-dev", "hdr-ic-lora", "t2a"}
    assert [r.name for r in RECIPES if not r.video] == ["t2a"]
    assert "--stage2-tiles" in {m.flag for m in taken_by(BY_NAME["two-stage"])}
    assert "--stage2-tiles" not in {m.flag for m in taken_by(BY_NAME["two-stage-hq"])}


@pytest.mark.parametrize(("extra", "line"), [
    ({"pipeline": "two-stage-hq", "stage2_tiles": "1x2"},
     "--stage2-tiles does not apply to the two-stage-hq recipe (--pipeline two-stage-hq); it applies to: distilled, "
     "two-stage, dfr, extend, ic-lora, dub-it"),
    ({"pipeline": "one-stage", "dfr": True}, "--dfr and --pipeline one-stage are two recipes: give one"),
    ({"pipeline": "two-stage", "stg_scale": 1.0, "temporal_upscalings": 1},
     "--temporal-upscalings does not apply to the two-stage recipe (--pipeline two-stage); it applies to: dfr"),
    ({"detailing_lora": "d.safetensors"},
     "--detailing-lora does not apply to the distilled recipe (--pipeline distilled); it applies to: dfr, retake, "
     "extend, ic-lora, dub-it"),
    ({"pipeline": "t2a", "stage1_parallel": "2"},
     "--stage1-parallel does not apply to the t2a recipe (--pipeline t2a); it applies to: distilled, dfr, retake, "
     "extend, ic-lora, dub-it, hdr-ic-lora, one-stage, two-stage, two-stage-hq, retake-dev, extend-dev"),
    ({"pipeline": "t2a", "loras": [{"file": "a.safetensors", "strength": 1.0}], "lora_mode": "unfused"},
     "--lora-mode unfused does not apply to the t2a recipe (--pipeline t2a); it applies to: distilled, one-stage, "
     "two-stage, two-stage-hq, dfr, retake, extend, ic-lora, dub-it"),
])
def test_a_modifier_the_recipe_does_not_take_is_one_line_naming_those_that_do(extra, line):
    with pytest.raises(SpecError) as refused:
        check_recipe_spec(normalize_spec({**BASE, **extra}), PackFacts("tiny"))
    assert str(refused.value) == line


def test_a_modifier_the_recipe_takes_passes():
    for recipe in RECIPES:
        for mod in taken_by(recipe):
            assert recipe.name in mod.recipes


@pytest.fixture(scope="module")
def tiny_fleet(tiny_packs: Path, tiny25_pack: Path, tiny_dev_pack: Path, tmp_path_factory) -> list[dict]:
    """One worker describing the three tiny packs as a real worker does (its runner's own readings)."""
    from worker.runner import Runner

    folder = link_packs(tmp_path_factory.mktemp("recipe-packs"), tiny=tiny_packs / "tiny", tiny25=tiny25_pack,
                        dev=tiny_dev_pack)
    runner = Runner(folder)
    names = runner.pack_names()
    holdings, problems = runner.pack_holdings()
    return [{"packs": names, "pack_components": holdings, "pack_problems": problems,
             "pack_features": {n: runner.pack_features(n) for n in names},
             "pack_generation": {n: g for n in names if (g := runner.pack_generation(n))},
             "memory_bytes": 64 * 2**30}]


@pytest.mark.parametrize("pack", ["tiny", "tiny25", "dev"])
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_every_recipe_with_its_defaults_passes_or_refuses_in_one_line_on_the_tiny_packs(recipe, pack, tiny_fleet):
    worker = tiny_fleet[0]
    facts = PackFacts(pack, worker["pack_generation"].get(pack), frozenset(worker["pack_components"][pack]))
    spec = RenderPlan(RenderSpec.from_dict({**BASE, **recipe.default_spec, "pack": pack}),
                      Resolved(generation=facts.generation))
    assert recipe_for(spec) is recipe
    for check in (lambda: recipe.check(spec, facts), lambda: plan_render(validate_spec(spec, tiny_fleet), "r")):
        try:
            check()
        except SpecError as exc:
            assert str(exc) and "\n" not in str(exc), (recipe.name, pack, str(exc))


@pytest.mark.parametrize("raw,line", [
    ({"control_video": {"blob": "0" * 64}, "ic_lora": {"blob": "1" * 64, "strength": 1.0, "downscale": 1},
      "dfr": True, "num_generated_keyframes": 1},
     "--num-generated-keyframes and --dfr do not compose (DFR places its own keyframe slots)"),
    ({"retake": {"start": 0.1, "end": 0.2}, "source_video": {"blob": "0" * 64}, "detailing_lora": "d.safetensors"},
     "--detailing-lora needs one of --dfr, --temporal-upscalings, --spatial-upscalings 2 (it details DFR's stage 2)"),
    ({"dub_video": {"blob": "0" * 64, "attention_strength": 0.5},
      "ic_lora": {"blob": "1" * 64, "strength": 1.0, "downscale": 1}},
     "--control-attention does not apply to the dub-it recipe (--dub); it applies to: ic-lora"),
    ({"dub_video": {"blob": "0" * 64}, "control_video": {"blob": "2" * 64},
      "ic_lora": {"blob": "1" * 64, "strength": 1.0, "downscale": 1}},
     "--dub and --control-video are two recipes: give one"),
    ({"control_video": {"blob": "0" * 64}, "ic_lora": {"blob": "1" * 64, "strength": 1.0, "downscale": 1},
      "pipeline": "two-stage"},
     "--control-video and --pipeline two-stage are two recipes: give one (IC-LoRA control samples distilled: "
     "upstream's ICLoraPipeline takes the distilled model alone, and the MLX port's dev mode fuses the distilled "
     "LoRA and runs no guidance)"),
    ({"dub_video": {"blob": "0" * 64}, "ic_lora": {"blob": "1" * 64, "strength": 1.0, "downscale": 1},
      "pipeline": "one-stage"},
     "--dub and --pipeline one-stage are two recipes: give one (Dub-It samples distilled: upstream's "
     "DubItPipeline and the MLX port's lipdub take the distilled model alone, its LoRA in both stages)"),
])
def test_a_modifier_that_needs_or_excludes_another_is_refused_by_the_table(raw, line):
    from coordinator.plan.recipes import recipe_for
    from coordinator.plan.recipes.modifiers import refusal

    plan = RenderPlan.from_stored({"prompt": "a fox", **raw})
    assert refusal(recipe_for(plan), plan) == line
