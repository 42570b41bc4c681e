"""The records a recipe and a modifier are written as. Pure.

Why a record: a recipe (one of the farm's generation pipelines) is one thing with one name, and its
facts (what it is for, its upstream reference, the flags it takes, the pack components it loads, how
many stages it runs, whether it runs guidance passes) are data the planner, the CLI and the docs read
alike, rather than a pipeline name compared wherever a fact is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coordinator.plan.guidance import GuidedRule
from coordinator.plan.resolved import RenderPlan

if TYPE_CHECKING:
    from coordinator.plan.build import Prompt

Check = Callable[[RenderPlan, "PackFacts"], "dict | None"]
Picked = Callable[[RenderPlan], bool]
Build = Callable[["Recipe", RenderPlan, "Prompt"], list[dict]]


@dataclass(frozen=True, slots=True)
class PackFacts:
    """What the planner knows of a render's pack: its LTX generation and components (None: no worker
    has described it, so the checks that need it pass)."""

    name: str
    generation: str | None = None
    components: frozenset[str] | None = None


def _none(spec: RenderPlan, pack: PackFacts) -> dict | None:
    return None


def _always(spec: RenderPlan) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Recipe:
    """One recipe as data. `pipeline`: the spec's `pipeline` value it runs under; `flag`: how a user
    picks it; `picked`: whether a spec under that pipeline asks for it (the registry tries recipes in
    order); `fields`: the spec fields that are its own; `components`: the pack components its default
    render loads; `check`: its own rules (one line each), returning what they resolve; `builds`: its graph
    after the prompt's text task, composed of the shared blocks (`plan/build.py`)."""

    name: str
    purpose: str
    upstream: str
    flag: str
    builds: Build
    pipeline: str = "distilled"
    picked: Picked = _always
    fields: tuple[str, ...] = ()
    components: tuple[str, ...] = ()
    check: Check = _none
    two_stage: bool = True  # a half-size stage 1, the spatial upsample, a full-size stage 2
    guidance: GuidedRule | None = None  # its guided stage's rule (guidance passes on the dev DiT, a negative prompt)
    distilled_stage2: bool = True  # stage 2 samples with the distilled generation's sampler rule
    video: bool = True  # a video stream and picture (False: the audio track alone, T2A)
    dits: tuple[str, ...] = ("transformer", "spatial_upscaler")  # its stages' DiTs and upsampler (pack components)
    default_spec: Mapping = field(default_factory=dict)  # fields beside the base spec for its default render

    def build(self, spec: RenderPlan, prompt: Prompt) -> list[dict]:
        """The render's graph after its prompt's text task (validated: the recipe's modifiers are ones it takes)."""
        return self.builds(self, spec, prompt)

    @property
    def guided(self) -> bool:
        """Its first stage runs guidance passes (CFG/STG/modality) on the dev DiT."""
        return self.guidance is not None


@dataclass(frozen=True, slots=True)
class Modifier:
    """A flag that crosses recipes: the spec fields that turn it on (`on`, when a plain non-default test
    is not enough) and the recipes it composes with. `selects`: the recipe this flag picks, when it is
    one (two such flags are two recipes). `needs` / `excludes`: flags of other modifiers one of which it
    needs, or none of which it takes, on any recipe, for the reason `rule` says; `picks_rule`: why the
    recipes it picks have no variant under another recipe's flag; `others_rule`: why the recipes it does
    not list do not take it, said when one is given."""

    flag: str
    purpose: str
    fields: tuple[str, ...]
    recipes: tuple[str, ...]
    on: Picked | None = None
    selects: str | None = None
    needs: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    rule: str = ""
    picks_rule: str = ""  # why the recipes it picks run under no other recipe's flag (said when one is given)
    others_rule: str = ""  # why the recipes left out of `recipes` do not take it (said when one is given)
