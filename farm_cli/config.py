"""The farm's settings for people: DATA/config.toml (DATA = --data, $FARM_DATA or ~/.ltx-farm) and
FARM_* variables, so a laptop names its coordinator, token, pack and output folder once.

Precedence: a flag on the command line, then FARM_* in the environment, then the file, then the
built-in default. `farm config` prints every value with where it came from. The file's
[text_encoders] table (pack = encoder) is read by common.text_encoder_choice.
"""

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm_cli.options import DataDir
from farm_cli.session import fail, one_line
from protos import defaults
from protos.defaults import COORDINATOR_ADDRESS

# key: (environment variable, what it is). Top-level keys of config.toml.
SETTINGS: dict[str, tuple[str, str]] = {
    "coordinator": ("FARM_COORDINATOR", "HOST:PORT of the coordinator, or a comma-separated list"),
    "token_file": ("FARM_TOKEN_FILE", "a copy of the coordinator's DATA/token"),
    "pack": ("FARM_PACK", "the pack renders use unless --pack says otherwise"),
    "output_dir": ("FARM_OUTPUT_DIR", "where `farm fetch` writes when -o is not given"),
    "user": ("FARM_USER", "the submitter name renders carry (default user@host)"),
    "redis_url": ("FARM_REDIS_URL", "an external Redis for `farm up` / `farm coordinator`"),
}
TABLES = {"text_encoders"}
# Command parameters a setting is the default of (click's default_map; the flag and the env still win).
PARAMS = {"coordinator": "coordinator", "pack": "pack", "redis_url": "redis_url"}


CONFIG_FILE = "config.toml"


def data_dir(given: Path | None = None) -> Path:
    """The farm's data folder: --data, $FARM_DATA, or ~/.ltx-farm."""
    path = Path(given).expanduser() if given else defaults.default_data_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


def farm_config(data: Path | None = None) -> dict:
    """The farm's config file (DATA/config.toml), {} when there is none; one line when it is broken."""
    import tomllib

    path = data_dir(data) / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        fail(f"{path}: not a readable TOML file ({exc})")


def user_at_host() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = "someone"
    return f"{user}@{socket.gethostname().split('.')[0]}"


def submitter() -> str:
    """Who submits, as `farm ls` and the dashboard show it: $FARM_USER, the config's user, else user@host."""
    return value("user") or user_at_host()


def local_token(data: Path | None = None) -> str:
    """This machine's farm token when no --token-file was given: FARM_TOKEN, FARM_TOKEN_FILE, the macOS
    keychain, the config's token_file, DATA/token (protos.auth.resolve_token); '' when none has one."""
    from protos.auth import TokenError, resolve_token

    configured = value("token_file")
    fallback = (Path(configured),) if configured else ()
    with one_line(TokenError):
        return resolve_token(None, fallback_files=(*fallback, data_dir(data) / "token"))


@dataclass(frozen=True)
class Setting:
    """One resolved value and where it came from: env, file, found or default."""

    key: str
    value: str | None
    source: str


def data_from_argv(argv: list[str]) -> Path | None:
    """--data DIR / --data=DIR on this command line, read before click parses it (it locates the file)."""
    for i, arg in enumerate(argv):
        if arg == "--data" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--data="):
            return Path(arg.split("=", 1)[1])
    return None


def folder_of(data: Path | None = None) -> Path:
    """The data folder without creating it (reading settings must not change the machine)."""
    return Path(data).expanduser() if data else defaults.default_data_dir()


def read_file(data: Path | None = None) -> tuple[Path, dict]:
    """The config file's path and its top-level settings; unknown keys are one line and exit 2."""
    path = folder_of(data) / CONFIG_FILE
    values = farm_config(data) if path.is_file() else {}
    unknown = sorted(set(values) - set(SETTINGS) - TABLES)
    if unknown:
        fail(f"{path}: unknown setting {unknown[0]!r} (known: {', '.join(SETTINGS)}, [text_encoders])")
    return path, values


def _default(key: str, data: Path) -> Setting:
    if key == "coordinator":
        return Setting(key, COORDINATOR_ADDRESS, "default")
    if key == "token_file":
        return Setting(key, str(data / "token"), "default")
    if key == "pack":  # never whatever folder appears in DATA/packs: the default is named, and stays put
        return Setting(key, "tiny", "default")
    if key == "output_dir":
        return Setting(key, ".", "default")
    if key == "user":
        return Setting(key, user_at_host(), "default")
    return Setting(key, None, "default")


def resolve(data: Path | None = None) -> list[Setting]:
    """Every setting: env, else file, else default (the pack: tiny until config.toml or FARM_PACK names one)."""
    folder = folder_of(data)
    path, values = read_file(data)
    out = [Setting("data", str(folder), "--data" if data else "env FARM_DATA" if os.environ.get("FARM_DATA")
                   else "default")]
    for key, (env, _what) in SETTINGS.items():
        if os.environ.get(env):
            out.append(Setting(key, os.environ[env], f"env {env}"))
        elif key in values:
            out.append(Setting(key, str(values[key]), f"file {path}"))
        else:
            out.append(_default(key, folder))
    return out


def value(key: str, data: Path | None = None) -> str | None:
    return next(s.value for s in resolve(data) if s.key == key)


def default_map(command: Any, argv: list[str] | None = None) -> dict:
    """click's default_map: each command parameter named in PARAMS defaults to the resolved setting."""
    resolved = {s.key: s for s in resolve(data_from_argv(sys.argv[1:] if argv is None else argv))}
    defaults = {key: resolved[key].value for key in PARAMS if resolved[key].source != "default"}

    def walk(cmd: Any) -> dict:  # typer's click commands: groups have .commands, commands .params
        if hasattr(cmd, "commands"):
            return {name: walk(sub) for name, sub in cmd.commands.items()}
        return {p.name: defaults[PARAMS[p.name]] for p in cmd.params
                if p.name in PARAMS and PARAMS[p.name] in defaults}

    return walk(command)


def show(data: DataDir = None) -> None:
    """Show every setting's value and where it came from (flag > FARM_* env > DATA/config.toml > default)."""
    settings = resolve(data)
    width = max(len(s.key) for s in settings)
    for s in settings:
        print(f"{s.key:<{width}}  {s.value if s.value is not None else '-'}  ({s.source})")
    table = farm_config(data).get("text_encoders") if (folder_of(data) / CONFIG_FILE).is_file() else None
    for pack, encoder in (table or {}).items():
        print(f"text_encoders.{pack}  {encoder}  (file {folder_of(data) / CONFIG_FILE})")
