"""DATA/config.toml and FARM_* settings: `farm config` shows each value with its source, and the client
commands take the coordinator, token file and pack from them when no flag is given."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.server import serve, stop
from tests.farm.farm_harness import ROOT, join_token

CLI = [sys.executable, "-c", "from farm_cli.main import main; main()"]


def farm(*args: str, data: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**base, "FARM_DATA": str(data), **env})


def settings(result: subprocess.CompletedProcess) -> dict[str, tuple[str, str]]:
    assert result.returncode == 0, result.stderr
    rows = {}
    for line in result.stdout.splitlines():
        key, rest = line.split(None, 1)
        value, source = rest.rsplit("  (", 1)
        rows[key] = (value.strip(), source.rstrip(")"))
    return rows


def test_config_shows_values_and_sources(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    rows = settings(farm("config", data=data))
    assert rows["coordinator"] == ("127.0.0.1:8471", "default") and rows["pack"] == ("tiny", "default")
    (data / "packs" / "ltx-2.3-mlx-q8").mkdir(parents=True)  # a pack appears: the default stays put (#27)
    assert settings(farm("config", data=data))["pack"] == ("tiny", "default")
    (data / "config.toml").write_text('coordinator = "studio.local:8471,backup.local:8471"\npack = "p1"\n'
                                      'output_dir = "~/Movies"\n[text_encoders]\np1 = "org/gemma"\n')
    rows = settings(farm("config", data=data, FARM_PACK="p2", FARM_USER="ana"))
    assert rows["coordinator"] == ("studio.local:8471,backup.local:8471", f"file {data / 'config.toml'}")
    assert rows["pack"] == ("p2", "env FARM_PACK") and rows["user"] == ("ana", "env FARM_USER")
    assert rows["output_dir"][0] == "~/Movies" and rows["text_encoders.p1"][0] == "org/gemma"
    assert rows["data"] == (str(data), "env FARM_DATA")


def test_a_typo_in_the_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('coordinatr = "x:1"\n')
    result = farm("status", data=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "unknown setting 'coordinatr'" in result.stderr


@pytest.mark.timeout(120)
def test_commands_take_coordinator_token_file_and_pack_from_the_file(store, tmp_data, tiny_packs, tmp_path):
    (tmp_data / "packs").mkdir()
    (tmp_data / "packs" / "studio-pack").symlink_to(tiny_packs / "tiny")
    server, port = serve(store, tmp_data, token="s" * 24)
    laptop = tmp_path / "laptop"
    laptop.mkdir()
    (laptop / "farm-token").write_text(join_token(tmp_data, "s" * 24) + "\n")
    (laptop / "config.toml").write_text(f'coordinator = "127.0.0.1:{port}"\ntoken_file = "{laptop / "farm-token"}"\n'
                                        'pack = "studio-pack"\nuser = "ana@laptop"\n')
    try:
        submitted = farm("submit", "-p", "a fox", data=laptop)
        assert submitted.returncode == 0, submitted.stderr
        rid = submitted.stdout.strip()
        spec = store.get_render(rid)["spec"]
        assert spec["pack"] == "studio-pack" and spec["submitter"] == "ana@laptop"
        listed = farm("status", data=laptop)
        assert listed.returncode == 0 and rid in listed.stdout and "ana@laptop" in listed.stdout, listed.stderr
        flagged = farm("status", "--coordinator", "127.0.0.1:1", data=laptop)  # a flag beats the file
        assert flagged.returncode == 1 and "127.0.0.1:1" in flagged.stderr
    finally:
        stop(server)
