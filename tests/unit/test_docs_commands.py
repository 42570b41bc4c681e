"""Every `farm …` line the docs show in a code block parses with the CLI's own parser, so a renamed or
removed flag fails here instead of in a newcomer's terminal. Nothing runs: each line is handed to
click's `make_context` on the command it names (the same parse `farm` does before a command runs).

Placeholders in the docs (ID, DIR, FILE, N, ...) are given sample values; `...` means "the rest of the
command omitted", so an elided line is not held to the options it leaves out. `[--opt VALUE]` is
checked both left out and put in (the first of `a|b` alternatives). Also held here: README's size, its
two set-up commands at the top (the test command is the one `.ci/run` runs), ARCHITECTURE's size."""

from __future__ import annotations

import copy
import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer import _click as click  # the click typer vendors (the lock's typer): the CLI's own parser
from typer.core import TyperGroup

from farm_cli.loras import pair_argv
from farm_cli.main import app

ELIDED = "..."
ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "ops" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX, ARCHITECTURE_MAX = 10 * 1024, 30 * 1024

# Placeholder words the docs use for values, with a sample value each.
SAMPLES = {
    "ID": "r-0001", "RENDER_ID": "r-0001", "TASK": "stage1", "GROUP": "g-0001", "DIR": "out", "FILE": "file.safetensors",
    "N": "2", "K": "2", "DAYS": "14", "REPO_OR_DIR": "owner/repo", "WORKER": "worker-1", "L": "standard",
    "G": "g-0001", "F": "prompts.txt", "TAUS": "1.0,1.25", "NAME": "srgb-linear", "S": "0.5",
    "SOURCE": "style.safetensors", "STRENGTH": "0.8", "PATH": "a.png", "FRAME": "0", "CLIP": "clip.mp4",
    "OUTPUT": "out.mp4", "MIN:MAX": "2:8", "P": "tiny"
}


@dataclass(frozen=True)
class DocLine:
    """One shell line from a code block: where it is and its text (continuations joined)."""

    path: Path
    lineno: int
    text: str

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.lineno}"


def code_lines(path: Path) -> list[DocLine]:
    """The lines of fenced blocks and of indented blocks (4+ spaces after a blank or code line)."""
    out: list[DocLine] = []
    fenced, prev_code, prev_blank, pending = False, False, True, None
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced, prev_code = not fenced, False
            continue
        indented = line.startswith("    ") and line.strip() and (prev_blank or prev_code)
        in_code = fenced or bool(indented)
        if in_code:
            if pending is not None:  # a `\` continuation: this line is part of the one before
                pending = DocLine(pending.path, pending.lineno, pending.text + " " + line.strip())
            else:
                pending = DocLine(path, lineno, line.strip())
            if pending.text.endswith("\\"):
                pending = DocLine(pending.path, pending.lineno, pending.text[:-1].rstrip())
            else:
                out.append(pending)
                pending = None
        prev_code, prev_blank = in_code, not line.strip()
    return out


def farm_commands(text: str) -> list[str]:
    """The `farm …` commands in one shell line: split at `&&`, `;` and ` / farm` (a list of commands)."""
    text = re.sub(r"\s+/\s+(?=farm\s)", " && ", text)
    return [seg.strip() for seg in re.split(r"&&|;", text) if re.match(r"(\S*/)?farm(\s|$)", seg.strip())]


def variants(command: str) -> list[str]:
    """The command with optional `[...]` parts left out, and with them put in (first `a|b` alternative)."""
    left_out = re.sub(r"\[[^\[\]]*\]", " ", command)
    put_in = re.sub(r"\[([^\[\]]*)\]", r"\1", command)
    put_in = re.sub(r"(?<![\w/])([\w.,-]+)(\|[\w.,-]+)+", r"\1", put_in)
    return list(dict.fromkeys([left_out, put_in]))


def argv_of(command: str) -> tuple[list[str], bool]:
    """Shell words after `farm`, placeholders filled; and whether the line elides the rest (`...`)."""
    words = shlex.split(command, comments=True)[1:]
    return [SAMPLES.get(word, word) for word in words], ELIDED in words


def fill_elided(command: click.core.Command, args: list[str]) -> list[str]:
    """`...` as an option's value is a sample value; anywhere else it stands for options left out."""
    valued = {opt for param in command.params if not getattr(param, "is_flag", False) for opt in param.opts}
    return [("x" if i and args[i - 1] in valued else None) if arg == ELIDED else arg
            for i, arg in enumerate(args) if arg != ELIDED or (i and args[i - 1] in valued)]


def optional(command: click.core.Command) -> click.core.Command:
    """A copy of `command` whose parameters are all optional: what an elided line leaves out."""
    loose = copy.copy(command)
    loose.params = [copy.copy(param) for param in command.params]
    for param in loose.params:
        param.required = False
    return loose


@functools.cache
def root() -> click.core.Command:
    """The `farm` command tree, as `farm` builds it."""
    return typer.main.get_command(app)


def parse(argv: list[str], elided: bool) -> str | None:
    """Parse `farm ARGV` down to its command without running it: None, or why the CLI refuses it."""
    if any(arg == "--token" or arg.startswith("--token=") for arg in argv):
        return "--token on the command line (the CLI refuses it)"
    command = root()
    ctx = click.core.Context(command, info_name="farm")
    args = pair_argv(argv)
    while isinstance(command, TyperGroup):
        if not args:
            return None if elided else "no command given"
        name, args = args[0], args[1:]
        sub = command.get_command(ctx, name)
        if sub is None:
            return f"no such command {name!r}"
        command, ctx = sub, click.core.Context(sub, info_name=name, parent=ctx)
    if elided:
        command, args = optional(command), fill_elided(command, args)
    try:
        with command.make_context(ctx.info_name, list(args), parent=ctx.parent) as _:
            return None
    except typer.Exit:
        return None
    except click.exceptions.UsageError as exc:
        return exc.format_message()


def all_commands() -> list[tuple[DocLine, str]]:
    """Every `farm` command in every code block of README.md and docs/**/*.md."""
    return [(line, command) for path in DOCS for line in code_lines(path) for command in farm_commands(line.text)]


@pytest.mark.timeout(60)
def test_every_farm_command_in_the_docs_parses() -> None:
    found = all_commands()
    assert len(found) > 80, f"only {len(found)} farm commands found in the docs: is the block reader broken?"
    refused = []
    for line, command in found:
        for variant in variants(command):
            argv, elided = argv_of(variant)
            why = parse(argv, elided)
            if why:
                refused.append(f"{line.where()}: `{variant.strip()}`: {why}")
    assert not refused, "docs show commands the CLI refuses:\n" + "\n".join(refused)


@pytest.mark.timeout(60)
def test_the_parser_check_catches_a_renamed_flag_and_a_missing_command() -> None:
    assert parse(["submit", "-p", "fox", "--stage2-tiles", "2x2"], elided=False) is None
    assert "--stage-two-tiles" in (parse(["submit", "-p", "fox", "--stage-two-tiles", "2x2"], elided=False) or "")
    assert "no such command" in (parse(["sbumit", "-p", "fox"], elided=False) or "")
    assert parse(["pack", "tiny", "out", "--layout", "dev-only"], elided=False) is None
    assert parse(["render", "--image", "a.png", "0", "1", "-o", "x.mp4"], elided=False) is None


@pytest.mark.timeout(60)
def test_readme_is_short_and_opens_with_the_two_set_up_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= README_MAX, f"README.md is {len(readme.encode())} bytes (at most {README_MAX})"
    architecture = (ROOT / "docs" / "ARCHITECTURE.md").read_bytes()
    assert len(architecture) <= ARCHITECTURE_MAX, f"ARCHITECTURE.md is {len(architecture)} bytes"
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    first_blocks = [line.text for line in code_lines(ROOT / "README.md")][:2]
    assert first_blocks[1] in ci_lines and "pytest" in first_blocks[1], "README's second block: the command .ci/run runs"
    assert first_blocks[0].startswith("python3 -m venv .venv") and first_blocks[0].endswith("farm demo -o demo.mp4")
    assert readme.index(first_blocks[1]) < readme.index("\n## "), "the set-up commands come before any section"


@pytest.mark.timeout(60)
def test_docs_have_no_ticket_numbers() -> None:
    numbered = [f"{path.relative_to(ROOT)}:{n}" for path in DOCS
                for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"issue #\d+", line)]
    assert not numbered, f"say what, not which ticket: {numbered}"
