"""`--image PATH FRAME STRENGTH`, repeatable: typer takes a tuple option or a repeated one, not a repeated
tuple, so the commands that have it (render, submit, plan) are built with `ImageCommand`, which makes
their `--image` take three values per use and coerces each to (Path, str, float). FRAME stays text
(an index, negative from the end, or `last`; `farm_cli.images` reads it)."""

from __future__ import annotations

from pathlib import Path

from typer import _coercion
from typer.core import TyperCommand

IMAGE_VALUES = list[tuple[Path, str, float]]


class ImageCommand(TyperCommand):
    """A command whose `image` option is repeatable with three values per use."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.name == "image":
                param.nargs, param.metavar = 3, "PATH FRAME STRENGTH"
                descriptor = _coercion.TypeDescriptor(annotation=IMAGE_VALUES, file_annotation=None,
                                                      parameter_info=param.type_descriptor.parameter_info)
                param._runtime_param = _coercion.build_runtime_param(descriptor)
