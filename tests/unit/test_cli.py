"""Bad input gets one clear line, exit code 2, and nothing queued."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    (["-p", ""], "prompt is empty"),
    (["-p", "fox", "-H", "250"], "height 250 is not a positive multiple of 64"),
    (["-p", "fox", "-f", "24"], "frames 24 is not of the form 8k+1"),
    (["-p", "fox", "--seed", "-1"], "seed -1 is negative"),
    (["-p", "fox", "-H", "4096"], "beyond the model's 2048 px"),
    (["-p", "fox", "--image", "/nonexistent.png", "0", "1.0"], "cannot read image"),
]


def _farm(*args: str, env_data, token: str = "") -> subprocess.CompletedProcess:
    code = "from farm_cli.main import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={"FARM_DATA": str(env_data), "PATH": "/usr/bin:/bin", **({"FARM_TOKEN": token} if token else {})})


@pytest.mark.parametrize(("args", "message"), CASES)
def test_render_refuses_bad_input_in_one_line(args, message, tmp_path):
    result = _farm("render", "--local", *args, "-o", str(tmp_path / "x.mp4"), env_data=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_unreachable_coordinator_is_one_line(tmp_path):
    from coordinator.api.auth import load_or_create_token

    load_or_create_token(tmp_path)  # FARM_DATA/token: a join token, so only the address is wrong
    result = _farm("submit", "-p", "fox", "--coordinator", "127.0.0.1:1", env_data=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "unreachable" in result.stderr


def test_submit_bad_input_queues_nothing(store, tmp_data, tiny_packs):
    from tests.farm.farm_harness import farm

    with farm(store, tmp_data, tiny_packs, workers=0) as (client, _):
        address, token = client.address, (tmp_data / "token").read_text().strip()
        for args, message in CASES[:5]:
            result = _farm("submit", *args, "--coordinator", address, env_data=tmp_data, token=token)
            assert result.returncode == 2 and message in result.stderr, result.stderr
        assert store.list_renders() == []
