"""The render options that take several values per use, repeatable: `--image PATH FRAME STRENGTH` and
`--segment TEXT SECONDS`. Typer takes a tuple option or a repeated one, not a repeated tuple, so the commands
that have them (render, submit, plan) are built with `MultiValueCommand`, which gives each its count of
values per use and coerces them to the option's tuple. An image's FRAME stays text (an index, negative from
the end, or `last`; `farm_cli.images` reads it)."""

from __future__ import annotations

from pathlib import Path

from typer import _coercion
from typer.core import TyperCommand

IMAGE_VALUES = list[tuple[Path, str, float]]
SEGMENT_VALUES = list[tuple[str, float]]
MULTI = {"image": (IMAGE_VALUES, 3, "PATH FRAME STRENGTH"), "segment": (SEGMENT_VALUES, 2, "TEXT SECONDS")}


class MultiValueCommand(TyperCommand):
    """A command whose `image` and `segment` options are repeatable with their count of values per use."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.name not in MULTI:
                continue
            annotation, param.nargs, param.metavar = MULTI[param.name]
            descriptor = _coercion.TypeDescriptor(annotation=annotation, file_annotation=None,
                                                  parameter_info=param.type_descriptor.parameter_info)
            param._runtime_param = _coercion.build_runtime_param(descriptor)
