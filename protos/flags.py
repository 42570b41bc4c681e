"""A render flag, declared once on its `RenderSpec` field: its rule, its options and how each is read.

Why on the field: a flag used to be spelled in seven places (a typer alias, a row of the option table,
the reader, a builder's argument list, the field, the field's rule, the stored order), and a new one
had to touch them all. Now the field's metadata holds its rule (what the spec accepts, checked where it
enters) and its `Flag`s (name, help, the command-line type and default, the parse from the typed text
to the field's raw value); the `farm` commands build their options from it (farm_cli/render_options.py)
and the stored order reads it (`ASKED_FIELDS`). A parse raises `SpecError` with the one line the user
sees, as the rule does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protos.fields import SpecError

RENDER_COMMANDS = ("render", "submit", "plan")
ASKED, GUIDANCE, SUBMIT = "asked", "guidance", "submit"  # how the render hash stores a field (resolved.py)
GIVEN = "given"  # asked, but stored only when given: a field renders before it never stored keep their views
FIELD = object()  # a flag's default: its field's


@dataclass(frozen=True, slots=True)
class Flag:
    """One command-line option of a spec field. `type`: its value's type on the command line (None: the
    field's); `parse`: that value as the field's raw value (None: as given; a value None is left out);
    `commands`: the `farm` commands that take it."""

    decls: tuple[str, ...]
    help: str | None = None
    type: Any = None
    default: Any = FIELD
    metavar: str | None = None
    parse: Callable[[Any], Any] | None = None
    commands: tuple[str, ...] = RENDER_COMMANDS

    @property
    def name(self) -> str:
        """The command's parameter: the long name in snake case (`--no-audio` -> `no_audio`)."""
        return self.decls[-1].removeprefix("--").replace("-", "_")


def opt(*decls: str, **kw: Any) -> Flag:
    """A Flag (`opt("-p", "--prompt", help=...)`)."""
    return Flag(decls=decls, **kw)


def spec_field(default: Any, rule: Callable | None, *flags: Flag, group: str = ASKED, client: bool = False,
               factory: Callable | None = None) -> Any:
    """A `RenderSpec` field with its rule and flags. `client`: its options name files or settings on
    the client, so the CLI reads them (farm_cli/render_options.py CLIENT_READERS), not `parse`."""
    meta = {"rule": rule, "flags": flags, "group": group, "client": client}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def field_flags(cls: type) -> list[tuple[dataclasses.Field, Flag]]:
    """Every (field, flag) of a spec record, in field order: the order `--help` lists them."""
    return [(f, flag) for f in dataclasses.fields(cls) for flag in f.metadata.get("flags", ())]


def flag_default(f: dataclasses.Field, flag: Flag) -> Any:
    return f.default if flag.default is FIELD else flag.default


def raw_from_flags(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The raw spec fields of the flags' values (fields read on the client left out); SpecError names
    the flag."""
    raw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        flags = f.metadata.get("flags", ())
        if not flags or f.metadata["client"] or flags[0].name not in values:
            continue
        value = values[flags[0].name]
        raw[f.name] = value if flags[0].parse is None or value is None else flags[0].parse(value)
    return {k: v for k, v in raw.items() if v is not None}


# ------------------------------------------------------------------ parse rules: typed text -> raw value


def given(value: Any) -> Any:
    """Left out unless given (an empty text or a False switch reads as not given)."""
    return value or None


def negated(value: bool) -> bool:
    """`--no-audio` and the like: the field is the switch's opposite."""
    return not value


def numbers(flag: str, example: str) -> Callable[[str], list[float] | None]:
    """A comma-separated list of numbers, e.g. `--stage2-sigmas 0.9,0.4,0`."""

    def parse(value: str) -> list[float] | None:
        if not value:
            return None
        try:
            return [float(x) for x in value.split(",")]
        except ValueError:
            raise SpecError(f"{flag} {value!r} is not a comma-separated list of {example}") from None
    return parse


def seconds_range(value: str) -> list[float] | None:
    """`--auto-duration MIN:MAX` as [min, max] (the spec's rule checks the numbers)."""
    if not value:
        return None
    low, sep, high = value.partition(":")
    try:
        if sep:
            return [float(low), float(high)]
    except ValueError:
        pass
    raise SpecError(f"--auto-duration {value!r} is not MIN:MAX seconds, e.g. 2:8")


def url(value: str) -> str | None:
    """`--notify URL`: only http(s) (the coordinator POSTs to it)."""
    if value and not value.startswith(("http://", "https://")):
        raise SpecError(f"--notify {value!r}: give an http:// or https:// URL")
    return value or None
