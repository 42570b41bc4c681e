"""Each render flag is declared once, on its `RenderSpec` field (protos/flags.py), and every command that
takes render flags builds them from there: the field's flags are in `farm render / submit / plan --help`,
no module of farm_cli spells one in its own `typer.Option`, and each flag's text is parsed by its field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from farm_cli.main import app
from farm_cli.render_options import spec_of_args
from farm_cli.spec import CLIENT_READERS
from protos.flags import RENDER_COMMANDS, field_flags
from protos.spec import SPEC_FIELDS, RenderSpec

ROOT = Path(__file__).resolve().parents[2]
FLAGS = field_flags(RenderSpec)
# Options that share a render flag's name but mean something else: the tiny pack's weight seed.
NOT_RENDER_FLAGS = {("farm_cli/main.py", "--seed")}


@pytest.mark.parametrize("command", RENDER_COMMANDS)
def test_every_field_flag_is_in_the_commands_help(command):
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "300", "TERMINAL_WIDTH": "300"})
    assert result.exit_code == 0, result.output
    for _, flag in FLAGS:
        if command in flag.commands:
            assert re.search(rf"{re.escape(flag.decls[-1])}\b", result.output), (command, flag.decls)
            if flag.help:
                assert flag.help[:30] in result.output, (command, flag.decls)


def test_no_render_flag_is_declared_outside_its_field():
    decls = {d for _, flag in FLAGS for d in flag.decls}
    found = []
    for path in sorted((ROOT / "farm_cli").rglob("*.py")):
        text = path.read_text()
        for call in re.finditer(r"typer\.Option\((.*?)\)", text, re.S):
            for name in re.findall(r"\"(-{1,2}[A-Za-z][\w-]*)\"", call.group(1)):
                where = (str(path.relative_to(ROOT)), name)
                if name in decls and where not in NOT_RENDER_FLAGS:
                    found.append(where)
    assert found == []


def test_rules_and_client_readers_come_from_the_fields():
    from dataclasses import fields

    assert set(SPEC_FIELDS) == {f.name for f in fields(RenderSpec)}
    assert set(CLIENT_READERS) == {f.metadata["client"] for f in fields(RenderSpec) if f.metadata["client"]}
    names = [flag.name for _, flag in FLAGS]
    assert len(names) == len(set(names))  # one parameter per flag


def test_flags_are_parsed_by_their_fields(tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_DATA", str(tmp_path))
    spec = spec_of_args(["-p", "fox", "--stage2-tiles", "2x2", "--stg-blocks", "28,29", "--pipeline", "two-stage",
                         "--stage2-sigmas", "0.9,0.4,0", "--auto-duration", "2:8", "--no-audio",
                         "--sparse-attention", "1.0,1.25", "--exr", "out", "--priority", "3"])
    assert (spec.stage2_tiles, spec.stg_blocks, spec.stage2_sigmas) == ("2x2", (28, 29), (0.9, 0.4, 0.0))
    assert (spec.auto_duration, spec.audio, spec.sparse_attention) == ((2.0, 8.0), False, (1.0, 1.25))
    assert spec.exr == str((Path.cwd() / "out").resolve()) and spec.priority == 3
    assert spec_of_args(["-p", "fox"], "render").priority is None  # --priority is submit's


@pytest.mark.parametrize(("args", "line"), [
    (["--stage2-sigmas", "a,b"], "farm: --stage2-sigmas 'a,b' is not a comma-separated list of numbers"),
    (["--auto-duration", "2to8"], "farm: --auto-duration '2to8' is not MIN:MAX seconds, e.g. 2:8"),
    (["--notify", "ftp://x"], "farm: --notify 'ftp://x': give an http:// or https:// URL"),
    (["--stg-blocks", "a", "--pipeline", "one-stage"], "farm: stg_blocks 'a' must be block numbers like 28 or 28,29"),
])
def test_a_bad_flag_is_one_line_exit_2(args, line, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FARM_DATA", str(tmp_path))
    with pytest.raises(typer.Exit) as exc:
        spec_of_args(["-p", "fox", *args])
    assert exc.value.exit_code == 2 and capsys.readouterr().err.strip() == line
