"""Where a farm token comes from: a file, an environment variable or the macOS keychain, never the
command line. The keychain branch runs a real `security` executable (a script on PATH that answers
like macOS's) with the platform given as darwin; on other platforms nothing is run."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from protos.auth import KEYCHAIN_SERVICE, TokenError, keychain_token, resolve_token

ROOT = Path(__file__).resolve().parents[2]
FARM = [sys.executable, "-c", "from farm_cli.main import main; main()"]


@pytest.fixture
def security(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `security` on PATH that prints the keychain token for exactly macOS's lookup, and logs each run."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "security"
    log = tmp_path / "security.log"
    script.write_text("#!/bin/sh\n"
                      f'echo "$@" >> {log}\n'
                      f'if [ "$*" = "find-generic-password -s {KEYCHAIN_SERVICE} -w" ]; then echo from-keychain; exit 0; fi\n'
                      "exit 44\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return log


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text + "\n")
    return path


def test_each_source_wins_over_the_ones_after_it(tmp_path: Path, security: Path) -> None:
    named, env_file, fallback = (_file(tmp_path, n, f"from-{n}") for n in ("named", "env-file", "fallback"))
    env = {"FARM_TOKEN": "from-env", "FARM_TOKEN_FILE": str(env_file)}
    mac = {"platform": "darwin", "fallback_files": (fallback,)}
    assert resolve_token(named, env=env, **mac) == "from-named"
    assert resolve_token(None, env=env, **mac) == "from-env"
    assert resolve_token(None, env={"FARM_TOKEN_FILE": str(env_file)}, **mac) == "from-env-file"
    assert not security.exists()  # the keychain is asked only when no file or variable has a token
    assert resolve_token(None, env={}, **mac) == "from-keychain"
    assert security.read_text().split() == ["find-generic-password", "-s", KEYCHAIN_SERVICE, "-w"]
    assert resolve_token(None, env={}, platform="linux", fallback_files=(fallback,)) == "from-fallback"
    assert resolve_token(None, env={}, platform="linux", fallback_files=(tmp_path / "absent",)) == ""


def test_the_keychain_is_asked_only_on_a_mac(security: Path) -> None:
    assert keychain_token("linux") == "" and not security.exists()
    assert keychain_token("darwin") == "from-keychain"


def test_a_mac_without_the_item_falls_through_to_the_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "security").write_text("#!/bin/sh\necho 'security: The specified item could not be found.' >&2\nexit 44\n")
    (folder / "security").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    fallback = _file(tmp_path, "token", "from-data-token")
    assert resolve_token(None, env={}, platform="darwin", fallback_files=(fallback,)) == "from-data-token"


def test_a_named_file_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(TokenError) as refused:
        resolve_token(tmp_path / "missing", env={"FARM_TOKEN": "would-be-ignored"})
    assert "missing" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(TokenError):
        resolve_token(None, env={"FARM_TOKEN_FILE": str(tmp_path / "missing")})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv", [
    [*FARM, "status", "--token", "s3cret"],
    [*FARM, "submit", "-p", "a fox", "--token=s3cret"],
    [*FARM, "worker", "--coordinator", "127.0.0.1:1", "--token", "s3cret"],
    [sys.executable, "-m", "worker.agent", "--coordinator", "127.0.0.1:1", "--token", "s3cret"],
])
def test_a_token_on_the_command_line_is_refused_in_one_line(argv: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FARM_DATA": str(tmp_path / "data")}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=90, env=env, cwd=ROOT)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "ps" in lines[0] and "--token-file" in lines[0] and "s3cret" not in lines[0]
    assert not (tmp_path / "data" / "token").exists()  # refused before anything ran


@pytest.mark.timeout(120)
def test_a_token_file_that_cannot_be_read_is_exit_2_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FARM_DATA": str(tmp_path / "data")}
    result = subprocess.run([*FARM, "status", "--token-file", str(tmp_path / "nope")], capture_output=True, text=True,
                            timeout=90, env=env, cwd=ROOT)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "nope" in lines[0], result.stderr
