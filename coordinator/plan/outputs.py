"""What a render's outputs ask for that the planner checks at submit (issue #29). Pure.

`--exr-colorspace` names the colourspace the assembler writes EXR frames in (`coordinator/assembler.py`
through `ltx_engine/color.py`); a name the farm does not know is refused here, in one line, before
anything is queued.
"""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.plan.graph import SpecError
from ltx_engine.color import EXR_COLORSPACES


def check_exr_colorspace(spec: Mapping) -> None:
    """An EXR colourspace is one the assembler writes, and asks for EXR frames."""
    name = spec.get("exr_colorspace")
    if name is None:
        return
    if name not in EXR_COLORSPACES:
        raise SpecError(f"--exr-colorspace {str(name)[:40]!r} is not one the farm writes: "
                        f"{', '.join(EXR_COLORSPACES)} (default {EXR_COLORSPACES[0]})")
    if not spec.get("exr"):
        raise SpecError(f"--exr-colorspace {name} names the colourspace of EXR frames: give --exr DIR too")
