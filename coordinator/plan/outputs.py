"""What a render's outputs ask for that the planner checks at submit. Pure.

`--exr-colorspace` names the colourspace the assembler writes EXR frames in (`coordinator/assemble/assembler.py`
through `ltx_engine/rules/color.py`); a name the farm does not know is refused here, in one line, before
anything is queued.
"""

from __future__ import annotations

from coordinator.plan.graph import SpecError
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.color import EXR_COLORSPACES


def check_exr_colorspace(spec: RenderPlan) -> None:
    """An EXR colourspace is one the assembler writes, and asks for EXR frames."""
    name = spec.exr_colorspace
    if name is None:
        return
    if name not in EXR_COLORSPACES:
        raise SpecError(f"--exr-colorspace {str(name)[:40]!r} is not one the farm writes: "
                        f"{', '.join(EXR_COLORSPACES)} (default {EXR_COLORSPACES[0]})")
    if not spec.exr:
        raise SpecError(f"--exr-colorspace {name} names the colourspace of EXR frames: give --exr DIR too")
