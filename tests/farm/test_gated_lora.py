"""`farm submit --detailing-lora REPO` for a gated repo the user has not accepted: the hub (a real HTTP
endpoint on 127.0.0.1 answering as huggingface.co does: 401 without a token, 403 with one) is asked
before anything is queued; one line names the licence page, exit 2, and the coordinator holds no render."""

from __future__ import annotations

import subprocess
import sys

import pytest

from coordinator.server import serve, stop
from tests.farm.farm_harness import ROOT, join_token
from tests.farm.hub_server import serve_repo

REPO = "Lightricks/LTX-2.5-22b-IC-LoRA-Pixel-Spatial-Upscaler"
TOKEN = "g" * 24


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hf_token", [None, "hf_not_accepted"], ids=["anonymous-401", "token-403"])
def test_a_gated_lora_repo_is_refused_at_submit(hf_token, store, tmp_data, tmp_path):
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "lora.safetensors").write_bytes(b"never served")
    server, port = serve(store, tmp_data, token=TOKEN)
    try:
        with serve_repo(tmp_path / "lora", REPO, gated=True) as (endpoint, sent):
            env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"),
                   "HF_ENDPOINT": endpoint, "FARM_DATA": str(tmp_path / "client"),
                   "FARM_TOKEN": join_token(tmp_data, TOKEN), **({"HF_TOKEN": hf_token} if hf_token else {})}
            args = ["submit", "-p", "a fox", "-H", "128", "-W", "192", "-f", "41", "--pack", "tiny25",
                    "--temporal-upscalings", "1", "--detailing-lora", REPO, "--coordinator", f"127.0.0.1:{port}"]
            done = subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", *args],
                                  capture_output=True, text=True, cwd=ROOT, timeout=60, env=env)
        assert done.returncode == 2, done.stderr[-2000:]
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"is gated: accept its licence at {endpoint}/{REPO}" in lines[0], done.stderr
        assert sent == [] and store.list_renders() == []  # nothing fetched, nothing queued
    finally:
        stop(server)
