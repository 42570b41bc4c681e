"""A tiny LTX-2.3 pack in the published layout (no text encoder inside) renders with a tiny Gemma 3 kept
outside it, on a real coordinator and worker, bit-identical to `--local`: once with a repo id from a
Hugging Face cache (offline, HF_HUB_CACHE in the worker's environment) and once with a folder that only
the coordinator holds, which pack distribution copies to the worker first. With no encoder anywhere
the submit and `render --local` refuse in one line naming the encoder and the command that fetches
it, exit 2, nothing queued."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from farm_cli.local import render_local
from ltx_engine.models.text_encoder import write_tiny_text_encoder
from ltx_engine.rules import text_encoders
from ltx_engine.tiny.tiny_pack import write_tiny_pack
from tests.farm.farm_harness import ROOT, assert_identical, farm, farm_results, local_results, wait_done
from tests.unit.test_text_encoders import hf_cache_repo

SPEC = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "frame_rate": 24.0, "seed": 3,
        "pack": "published"}
REFUSAL = ("the text encoder 'mlx-community/gemma-3-12b-it-4bit' that pack 'published' needs: "
           "fetch it with `farm pack pull mlx-community/gemma-3-12b-it-4bit`")


def _cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", *args],
                          capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={**os.environ, **env, "PYTHONPATH": str(ROOT)})


def _registered(store, name: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for w in store.list_workers():
            info = w.get("info") or {}
            if name in (info.get("text_encoders") or {}):
                return info
        time.sleep(0.2)
    raise AssertionError(f"no worker advertised the text encoder {name!r}")


@pytest.mark.timeout(600)
def test_published_pack_renders_with_a_separate_encoder(store, tmp_data, tmp_path, monkeypatch):
    packs, shelf, hub = tmp_path / "packs", tmp_data / "packs", tmp_path / "hub"
    write_tiny_pack(packs / "published", seed=0, layout="published-2.3")
    folder = write_tiny_text_encoder(shelf / "tiny-gemma", seed=0)        # only the coordinator holds it
    hf_cache_repo(hub, "farm/cached-gemma", write_tiny_text_encoder(tmp_path / "src", seed=2))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))                          # the worker's (and ours) hub cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("LTX_GEMMA_DIR", raising=False)

    local = render_local({**SPEC, "text_encoder": "farm/cached-gemma"}, tmp_path / "c.mp4", runner := _runner(packs))
    cached_ref = local_results(*local[1:])
    local = render_local({**SPEC, "text_encoder": str(folder)}, tmp_path / "f.mp4", runner)
    folder_ref = local_results(*local[1:])
    assert not np.array_equal(cached_ref["frames"], folder_ref["frames"])  # two encoders, two renders

    with farm(store, tmp_data, packs, workers=1) as (client, procs):
        info = _registered(store, "farm/cached-gemma")
        assert "tiny-gemma" not in info["text_encoders"] and "text_encoder" not in info["pack_components"]["published"]
        token = (tmp_data / "token").read_text().strip()
        refused = _cli("submit", "-p", "a fox", "-H", "128", "-W", "128", "-f", "9", "--pack", "published",
                       "--coordinator", client.address, env={"FARM_DATA": str(tmp_data), "FARM_TOKEN": token})
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and lines == [f"farm: no live worker holds {REFUSAL}"], refused.stderr
        assert store.list_renders() == []

        render = wait_done(client, client.submit({**SPEC, "text_encoder": "farm/cached-gemma"}))
        assert render["spec"]["text_encoder"] == "farm/cached-gemma"
        assert_identical(farm_results(client, render), cached_ref)

        render = wait_done(client, client.submit({**SPEC, "text_encoder": "tiny-gemma"}))  # copied from the shelf
        assert (packs / "tiny-gemma" / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
        assert_identical(farm_results(client, render), folder_ref)
        assert procs["w1"].poll() is None
        _registered(store, "tiny-gemma")  # registered again once the copy landed
        listed = _cli("pack", "list", "--coordinator", client.address, "--json",
                      env={"FARM_DATA": str(tmp_data), "FARM_TOKEN": token})
        rows = {r["text_encoder"]: r["bytes"] for r in json.loads(listed.stdout)["text_encoders"] if r["worker"] == "w1"}
        size = (folder / "model.safetensors").stat().st_size
        assert rows == {"farm/cached-gemma": size, "tiny-gemma": size}, listed.stdout


def _runner(packs):
    from worker.runner import Runner

    return Runner(packs)


@pytest.mark.timeout(240)
def test_render_local_without_the_encoder_refuses_in_one_line(tmp_path):
    data = tmp_path / "data"
    write_tiny_pack(data / "packs" / "published", seed=0, layout="published-2.3")
    env = {"FARM_DATA": str(data), "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    run = _cli("render", "--local", "-p", "a fox", "-H", "128", "-W", "128", "-f", "9", "--pack", "published",
               "-o", str(tmp_path / "x.mp4"), env=env)
    assert run.returncode == 2 and run.stderr.strip().splitlines() == [f"farm: this machine does not hold {REFUSAL}"]
    assert not (tmp_path / "x.mp4").exists()
    gemma = write_tiny_text_encoder(tmp_path / "gemma", seed=0)
    (data / "config.toml").write_text(f'[text_encoders]\npublished = "{gemma}"\n')  # the per-pack default
    assert text_encoders.find_local(str(gemma), None) == gemma
    run = _cli("render", "--local", "-p", "a fox", "-H", "128", "-W", "128", "-f", "9", "--pack", "published",
               "-o", str(tmp_path / "x.mp4"), env=env)
    assert run.returncode == 0 and (tmp_path / "x.mp4").stat().st_size > 0, run.stderr[-2000:]
    meta = (tmp_path / "x.json").read_text()
    assert str(gemma) in meta  # the metadata records the spec, and with it the encoder used
