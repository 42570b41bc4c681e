"""`farm join TOKEN`: a second Mac joins the farm with the join token alone.

The token carries the farm CA's fingerprint; the coordinator announces that fingerprint on the LAN
(protos/discovery.py), so join browses, keeps the farm whose fingerprint is the token's, checks the
secret with one authenticated call (a rotated token is refused here, in one line, not by a worker
retrying forever), saves the token to DATA/token (mode 600) and becomes `farm worker` for that
address. With --service it instead installs a launchd agent (a systemd user unit on Linux) that runs
`farm join --token-file DATA/token` at every start, so the farm is found again after a reboot or an
address change.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from farm_cli import common
from farm_cli.options import DataDir
from farm_cli.service_unit import ServiceUnit, farm_command, service_unit
from farm_cli.session import fail

BROWSE_S = 4.0  # mDNS answers come within ~1 s on a LAN; a few seconds covers a busy Wi-Fi


def join(
    token: Annotated[str | None, typer.Argument(
        help="The farm's join token (LTXF1.…, the coordinator's DATA/token), or - to read it from stdin. "
             "Default: --token-file, FARM_TOKEN, FARM_TOKEN_FILE, the keychain, DATA/token.")] = None,
    token_file: Annotated[Path | None, typer.Option("--token-file", help="Read the token from this file.")] = None,
    service: Annotated[bool, typer.Option(
        "--service", help="Install a launchd agent (systemd user unit on Linux) that joins at every boot.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Find the farm, then print the steps; change nothing.")] = False,
    browse_s: Annotated[float, typer.Option("--browse", help="Seconds to listen for farms on the LAN.")] = BROWSE_S,
    worker_id: Annotated[str | None, typer.Option("--worker-id", help="Default: this host's name.")] = None,
    packs_dir: Annotated[Path | None, typer.Option("--packs-dir", help="Where packs live on this Mac (default DATA/packs).")] = None,
    cache_dir: Annotated[Path | None, typer.Option("--cache-dir", help="Blob cache folder (default DATA/cache).")] = None,
    data: DataDir = None,
) -> None:
    """Join the farm of this token, found on the LAN by Bonjour/mDNS: run this Mac's worker for it."""
    from protos.discovery import zeroconf_missing

    text = _token_text(token, token_file, data)
    fingerprint = _fingerprint(text)
    missing = zeroconf_missing()
    if missing:
        fail(f"cannot look for the farm on the LAN: {missing}", code=1)
    address = find_farm(text, fingerprint, browse_s)
    folder = common.data_dir(data)
    saved = folder / "token"
    # As ops/install-worker.sh lays a worker out: packs the farm copies over and the blob cache in DATA.
    worker_args = _worker_args(worker_id, packs_dir or folder / "packs", cache_dir or folder / "cache")
    if dry_run:
        typer.echo(f"found the farm at {address}")
        typer.echo(f"+ write the token to {saved} (mode 600)")
    else:
        save_token(saved, text)
        typer.echo(f"farm join: found the farm at {address}; token saved in {saved}", err=True)
    if service:
        unit = service_unit(folder, ["join", "--token-file", str(saved), *worker_args])
        _install(unit, dry_run)
        return
    command = [*farm_command(), "worker", "--coordinator", address, "--token-file", str(saved), *worker_args]
    if dry_run:
        typer.echo("+ " + " ".join(command))
        return
    sys.stdout.flush()
    sys.stderr.flush()
    # exec: the worker runs as this process (signals, exit code, a service manager's supervision), and
    # the token given on the command line leaves the process list with the old argv.
    os.execve(command[0], command, {**os.environ, "FARM_DATA": str(folder)})


def _token_text(token: str | None, token_file: Path | None, data: Path | None) -> str:
    from protos.auth import NO_TOKEN, TokenError, resolve_token

    if token == "-":
        return sys.stdin.readline().strip()
    if token:
        return token.strip()
    try:
        found = resolve_token(token_file, fallback_files=(common.data_dir(data) / "token",))
    except TokenError as exc:
        fail(str(exc))
    if not found:
        fail(NO_TOKEN.replace("no farm token: give", "no farm token: give it as `farm join TOKEN`, or"))
    return found


def _fingerprint(text: str) -> str:
    from protos.auth import JoinToken, TokenError

    try:
        parsed = JoinToken.parse(text)
    except TokenError as exc:
        fail(str(exc))
    if not parsed.fingerprint:
        fail("this is not a join token (LTXF1.<CA fingerprint>.<secret>): copy the coordinator's DATA/token "
             "(~/.ltx-farm/token there)")
    return parsed.fingerprint


def find_farm(token: str, fingerprint: str, browse_s: float) -> str:
    """The address of the farm this token opens: announced with the token's fingerprint, its CA pinned
    in the TLS handshake and its secret accepted. One line and exit 2 when no farm announces this
    fingerprint (a wrong token) or the farm refuses the secret (a rotated token); exit 1 when the farm
    announces but none of its addresses answers."""
    from protos.discovery import browse

    farms = browse(browse_s)
    mine = [farm for farm in farms if farm.fingerprint == fingerprint]
    if not mine:
        others = f" ({len(farms)} other farm{'s' if len(farms) != 1 else ''} seen)" if farms else ""
        fail(f"no farm on this network announces this token's CA{others}: check the token is the coordinator's "
             "DATA/token and that its coordinator runs on this LAN (`farm coordinator --host 0.0.0.0`)")
    tried, addresses = [], [a for farm in mine for a in farm.addresses]
    for address in addresses:
        verdict = check_secret(address, token)
        if verdict == "":
            return address
        tried.append(f"{address} ({verdict})")
    # `farm up` and a default `farm coordinator` listen on their own machine only, and say so.
    local_only = all(a.startswith("127.") for a in addresses)
    hint = ": it listens on its own machine only; start it with `farm coordinator --host 0.0.0.0`" if local_only else ""
    fail(f"the farm announces itself but does not answer: {', '.join(tried)}{hint}", code=1)


def check_secret(address: str, token: str) -> str:
    """'' when the coordinator at address takes this token; exits 2 when it refuses the secret; else
    why it could not be asked (to try the farm's next address)."""
    import grpc

    from farm_cli.client import CoordinatorUnreachable, FarmClient, FarmError

    try:
        with FarmClient(address, token, timeout=5.0) as farm:
            farm.workers()
    except CoordinatorUnreachable:
        return "unreachable"
    except FarmError as exc:
        if exc.code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            fail(f"the farm at {address} refuses this token's secret (rotated with `farm token rotate`?): "
                 "copy the coordinator's DATA/token again")
        return str(exc)
    return ""


def save_token(path: Path, token: str) -> None:
    """DATA/token, mode 600, written whole. A coordinator's own data folder (it holds the farm CA) is
    never given another farm's token."""
    from coordinator.api.auth import write_token
    from protos.auth import JoinToken

    parsed = JoinToken.parse(token)
    if path.is_file():
        current = path.read_text().strip()
        if current == str(parsed):
            return
        if (path.parent / "tls").exists() and JoinToken.parse(current).fingerprint != parsed.fingerprint:
            fail(f"{path.parent} is the data folder of another farm's coordinator: give this Mac's worker its "
                 "own with --data")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_token(path, parsed)


def _worker_args(worker_id: str | None, packs_dir: Path | None, cache_dir: Path | None) -> list[str]:
    args = []
    for flag, value in (("--worker-id", worker_id), ("--packs-dir", packs_dir), ("--cache-dir", cache_dir)):
        if value is not None:
            args += [flag, str(Path(value).expanduser()) if isinstance(value, Path) else value]
    return args


def _install(unit: ServiceUnit, dry_run: bool) -> None:
    if dry_run:
        typer.echo(f"+ write {unit.path}:")
        typer.echo("\n".join(f"    {line}" for line in unit.text.splitlines()))
        for command in unit.activate:
            typer.echo("+ " + " ".join(command))
        return
    unit.write()
    unit.run_activation()
    typer.echo(f"farm join: installed {unit.path}; the worker starts now and after every reboot")
