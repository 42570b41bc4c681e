"""Every option type the `farm` commands share, written once (as arq's cli.py keeps its options together).

Why one module: a flag that means the same thing on several commands (--coordinator, --token-file,
--json) must read the same everywhere, and its default is part of it: --coordinator
defaults to protos.defaults.COORDINATOR_ADDRESS here, so a command takes `coordinator: Coordinator`
without restating the address (it is keyword-only where earlier parameters have defaults).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from farm_cli.session import one_line
from protos.defaults import COORDINATOR_ADDRESS


class _Default(str):
    """A default a typer alias can carry: typer forbids a value inside Annotated but takes a factory;
    click calls this one for the value and, it being the string itself, prints it in --help as a
    plain value would be (`[default: HOST:PORT]`, not `(dynamic)`)."""

    def __call__(self) -> str:
        return str(self)


def _token_from_file(path: str | None) -> str | None:
    """--token-file PATH becomes the token it holds (FARM_TOKEN, the keychain, DATA/token are read later)."""
    if not path:
        return None
    from protos.auth import TokenError, resolve_token

    with one_line(TokenError):
        return resolve_token(Path(path))


Coordinator = Annotated[str, typer.Option(
    "--coordinator", envvar="FARM_COORDINATOR", default_factory=_Default(COORDINATOR_ADDRESS),
    help="HOST:PORT, or HOST:PORT,HOST:PORT (leader + standbys).")]
Token = Annotated[str | None, typer.Option(
    "--token-file", callback=_token_from_file, metavar="PATH",
    help="A copy of the coordinator's DATA/token (else FARM_TOKEN, FARM_TOKEN_FILE, the macOS keychain, DATA/token).")]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
DataDir = Annotated[Path | None, typer.Option("--data", help="Farm data folder (default ~/.ltx-farm).")]

def _output_path(path: Path | None) -> Path | None:
    """-o's folder must be on this machine already, for a render, a `--local` render and a fetch alike:
    checked before anything runs (a farm render used to finish, then fail to write; --local made the
    folder). One line, exit 2."""
    if path is None:
        return None
    from farm_cli.session import fail

    folder = Path(path).expanduser().absolute().parent
    if not folder.is_dir():
        fail(f"-o {path}: there is no folder {folder} on this machine: make it first (mkdir -p {folder}) "
             "or give another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        fail(f"-o {path}: the folder {folder} is not writable by this user: give another path")
    return path


Output = Annotated[Path | None, typer.Option("-o", "--output", callback=_output_path)]
SaveLatents = Annotated[Path | None, typer.Option("--save-latents", help="Write each stage's latent here.")]


FleetFile = Annotated[Path | None, typer.Option(
    "--fleet", help="A described fleet (JSON/TOML: workers with name, chip, memory_gb, count) instead of the live one.")]

# Services (coordinator, up).
Port = Annotated[int, typer.Option("--port")]
RedisUrl = Annotated[str | None, typer.Option(
    "--redis-url", envvar="FARM_REDIS_URL",
    help="An external Redis: redis://HOST:PORT, or a replicated set by its sentinels, "
         "redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER (valkey+sentinel:// too).")]
DashHost = Annotated[str, typer.Option("--dashboard-host", help="0.0.0.0 opens the dashboard to the LAN.")]
DashPort = Annotated[int, typer.Option("--dashboard-port")]

# Packs (pack pull).
Kinds = Annotated[str, typer.Option("--kinds", help="Render kinds to fetch for: t2v, i2v, dfr (comma-separated).")]
PacksDir = Annotated[Path | None, typer.Option("--packs-dir", help="Pull into DIR/NAME (default: the HF cache).")]
