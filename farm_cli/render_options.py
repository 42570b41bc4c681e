"""The render flags of `render`, `submit`, `plan` (and the benches'), built from `RenderSpec`'s fields.

Why: a flag used to be spelled in an option alias, a row of an option table, the reader and a builder's
argument list besides its field, and the copies drifted. Each field now declares its flags (protos/flags.py);
`@render_options` appends them to a command's signature (typer reads `__signature__`), the command takes
them as `**asked`, and `asked_render` turns them into the typed spec: the fields' own parse rules, plus
the client's readers (farm_cli/spec.py) for the flags that name files or settings on this machine.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import Field
from pathlib import Path
from typing import Annotated, Any

import typer

from farm_cli.spec import CLIENT_READERS, AskedRender
from protos.flags import Flag, field_flags, flag_default, raw_from_flags
from protos.spec import RenderSpec, SpecError

SIMPLE = (int, float, str, bool, int | None, float | None, str | None)  # a field type an option takes as is


def _option_type(f: Field, flag: Flag) -> Any:
    """The option's value type: the flag's, else the field's when an option can hold it, else text."""
    if flag.type is not None:
        return flag.type
    hint = _spec_hints()[f.name]
    return hint if hint in SIMPLE else str | None


@functools.cache
def _spec_hints() -> dict[str, Any]:
    """RenderSpec's field types, evaluated once: every render command's flags read them, and evaluating the
    spec's annotations once per flag cost each `farm` invocation ~0.13 s of its ~0.8 s start."""
    return typing.get_type_hints(RenderSpec)


def _annotated(f: Field, flag: Flag, help: str | None = None) -> Any:
    option = typer.Option(*flag.decls, help=help or flag.help, metavar=flag.metavar)
    return Annotated[_option_type(f, flag), option]


def render_flags(command: str) -> list[inspect.Parameter]:
    """The keyword-only parameters of a command's render flags, in field order."""
    return [inspect.Parameter(flag.name, inspect.Parameter.KEYWORD_ONLY, annotation=_annotated(f, flag),
                              default=flag_default(f, flag))
            for f, flag in field_flags(RenderSpec) if command in flag.commands]


def render_options(command: Callable) -> Callable:
    """The command with its render flags appended to its signature (typer builds the options from it);
    the command receives them in its `**asked`."""
    own = inspect.signature(command, eval_str=True)
    kept = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    names = {p.name for p in kept}
    added = [p for p in render_flags(command.__name__) if p.name not in names]
    command.__signature__ = own.replace(parameters=kept + added)
    return command


def spec_option(name: str, help: str | None = None) -> Any:
    """A render flag as another command's option type (a bench's -H, fetch's --exr), from its field; the
    command gives its own default, `help` where the flag means something narrower there."""
    for f, flag in field_flags(RenderSpec):
        if flag.name == name:
            return _annotated(f, flag, help)
    raise KeyError(name)


def asked_render(asked: dict, *, data: Path | None = None, planning: bool = False) -> AskedRender:
    """The render the options ask for; one line, exit 2, for anything a flag or the spec refuses.
    `planning` (`farm plan`): images are not decoded (each file's sha256 stands in for its blob)."""
    from farm_cli.config import submitter
    from farm_cli.session import fail

    out = AskedRender()
    try:
        client = {}
        for read in CLIENT_READERS.values():
            client |= read(asked, out, data, planning)
        raw = {"submitter": submitter()} | raw_from_flags(RenderSpec, asked) | client
        if planning and not raw.get("prompt"):
            raw["prompt"] = "plan"
        out.spec = RenderSpec.from_dict(raw)
    except SpecError as exc:
        fail(str(exc))
    return out


def spec_of_args(args: list[str], command: str = "submit", data: Path | None = None) -> RenderSpec:
    """The spec `farm COMMAND ARGS` sends (ARGS: render flags only), parsed by a command holding that
    command's render flags (benches and tests; building it here keeps farm_cli.main out of the import)."""

    def flags_only(**asked: Any) -> dict:
        return asked

    from farm_cli.multi_option import MultiValueCommand

    flags_only.__name__ = command
    app = typer.Typer()
    app.command(name=command, cls=MultiValueCommand)(render_options(flags_only))
    click_command = typer.main.get_command(app)
    ctx = click_command.make_context(command, list(args), resilient_parsing=False)
    return asked_render(dict(ctx.params), data=data).spec
