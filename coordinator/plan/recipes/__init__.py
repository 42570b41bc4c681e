"""The recipe registry: a render's recipe is picked once, here, and its facts read from it. Pure.

Why: a recipe used to be a pipeline name compared wherever a fact was needed, and each feature module
kept its own list of the flags it refused. Now `recipe_for(spec)` is the one place that reads the
pipeline name; the planner, the CLI and the docs read the chosen `Recipe`'s facts; `check_recipe_spec`
refuses a modifier the recipe does not take in one line (`recipes/modifiers.py`) and runs the
recipe's own rules. The order of `RECIPES` is the order they are tried: a recipe picked by an input
(a clip, a control video) before the pipeline's own, DFR before the plain distilled render.
"""

from __future__ import annotations

from coordinator.plan.graph import SpecError
from coordinator.plan.guidance import REFERENCE_LAYERS, GuidedStage, check_recipe
from coordinator.plan.recipes.base import Modifier, PackFacts, Recipe
from coordinator.plan.recipes.dfr import DFR
from coordinator.plan.recipes.distilled import DISTILLED
from coordinator.plan.recipes.dub_it import DUB_IT
from coordinator.plan.recipes.extend import EXTEND
from coordinator.plan.recipes.extend_dev import EXTEND_DEV
from coordinator.plan.recipes.hdr_ic_lora import HDR_IC_LORA
from coordinator.plan.recipes.ic_lora import IC_LORA
from coordinator.plan.recipes.modifiers import MODIFIERS, refusal, taken_by, takes
from coordinator.plan.recipes.one_stage import ONE_STAGE
from coordinator.plan.recipes.retake import RETAKE
from coordinator.plan.recipes.retake_dev import RETAKE_DEV
from coordinator.plan.recipes.t2a import T2A
from coordinator.plan.recipes.two_stage import TWO_STAGE
from coordinator.plan.recipes.two_stage_hq import TWO_STAGE_HQ
from coordinator.plan.resolved import RenderPlan

RECIPES: tuple[Recipe, ...] = (HDR_IC_LORA, RETAKE, RETAKE_DEV, EXTEND, EXTEND_DEV, IC_LORA, DUB_IT, ONE_STAGE,
                               TWO_STAGE, TWO_STAGE_HQ, T2A, DFR, DISTILLED)
BY_NAME: dict[str, Recipe] = {r.name: r for r in RECIPES}
# the table order for people (docs, `farm recipes`): the plain recipes first
SHOWN: tuple[Recipe, ...] = (DISTILLED, ONE_STAGE, TWO_STAGE, TWO_STAGE_HQ, DFR, RETAKE, RETAKE_DEV, EXTEND,
                             EXTEND_DEV, IC_LORA, DUB_IT, HDR_IC_LORA, T2A)

__all__ = ["BY_NAME", "MODIFIERS", "RECIPES", "SHOWN", "Modifier", "PackFacts", "Recipe", "check_recipe_spec",
           "guided_stage", "recipe_for", "taken_by", "takes"]


def recipe_for(spec: RenderPlan) -> Recipe:
    """The render's recipe: the first, in order, that runs under its pipeline and that the spec picks."""
    pipeline = spec.pipeline
    for recipe in RECIPES:
        if recipe.pipeline == pipeline and recipe.picked(spec):
            return recipe
    raise SpecError(f"--pipeline {pipeline!r} names no recipe")  # the spec's own check refuses it first


def check_recipe_spec(spec: RenderPlan, pack: PackFacts) -> dict:
    """Refuse a modifier the recipe does not take (one line naming the recipes that do), then the recipe's
    own rules; what they resolve."""
    recipe = recipe_for(spec)
    line = refusal(recipe, spec)
    if line is not None:
        raise SpecError(line)
    return recipe.check(spec, pack) or {}


def guided_stage(spec: RenderPlan, num_layers: int = REFERENCE_LAYERS) -> GuidedStage | None:
    """The render's guided stage resolved by its recipe's rule (None: the recipe runs no guidance), or one
    line saying why it cannot run on a DiT of `num_layers` blocks."""
    return check_recipe(spec, recipe_for(spec).guidance, num_layers)
