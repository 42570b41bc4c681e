"""How a `farm` command fails: one clear line on stderr and a fixed exit code, never a traceback.

Why one place: every command talks to the coordinator through FarmClient, whose errors (unreachable,
refused, not this farm's token) are already written for people; the CLI only has to print them and
exit. `one_line` is that rule as a context manager, so a command says once which errors it turns
into its line and with which code (1: the farm said no or is away; 2: the user's input is wrong).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NoReturn

import typer


def fail(message: str, code: int = 2) -> NoReturn:
    """One clear line on stderr and an exit code; never a traceback for a user mistake."""
    typer.echo(f"farm: {message}", err=True)
    raise typer.Exit(code)


UNREACHABLE_NEXT = ": start one with `farm up`, or name yours with --coordinator / FARM_COORDINATOR"


@contextlib.contextmanager
def one_line(*also: type[Exception], code: int = 2, hint: str = "", unreachable: str = "") -> Iterator[None]:
    """A FarmError (and any of `also`: a token, spec or pack error) raised inside becomes
    `farm: MESSAGE{hint}` on stderr and exit `code`; a coordinator that does not answer gets the next
    step (start one, name it; `unreachable` adds a command's own, e.g. render's `--local`)."""
    from farm_cli.client import CoordinatorUnreachable, FarmError

    try:
        yield
    except (FarmError, *also) as exc:
        next_step = f"{UNREACHABLE_NEXT}{unreachable}" if isinstance(exc, CoordinatorUnreachable) else ""
        fail(f"{exc}{next_step}{hint}", code=code)
