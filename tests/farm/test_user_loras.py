"""User LoRAs on the farm, through the real CLI, coordinator and worker processes.

Two stacked seeded LoRAs (one in the reference layout, one in ComfyUI's with an alpha) on the tiny pack,
with stage 2 in 2x2 tiles and a tiled decode: every task output of the farm render (2 workers) is the
same blob, bit for bit, as `farm render --local`'s; a second render with the same set fuses 0 times on
a worker that kept the fused DiT (the task metrics' `lora_fusions`); the same with `--lora-mode
unfused`. Each refusal at submit is one line naming the file and the first bad key, exit 2, nothing
queued. One farm serves the module; the coordinator's shelf holds the pack (as after `farm pack pull`),
which is what it reads the pack's shapes from at submit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from farm_cli.local import render_local
from farm_cli.remote import latents_from_outputs
from ltx_engine.lora.lora import file_sha256
from protos.tensors import decode_tensor
from tests.farm.farm_harness import ROOT, farm, join_token, wait_done
from tests.farm.hub_server import serve_repo
from tests.farm.user_loras import tiny_lora_shapes, write_user_loras

BASE = ["-p", "a fox", "-H", "128", "-W", "256", "-f", "9", "--seed", "5", "--pack", "tiny",
        "--stage2-tiles", "2x2", "--tile-overlap", "1", "--decode-tiles", "32,128,128"]
SPEC = {"prompt": "a fox", "height": 128, "width": 256, "frames": 9, "seed": 5, "pack": "tiny",
        "stage2_tiles": "2x2", "tile_overlap": 1, "decode_tiles": "32,128,128"}
STRENGTHS = (0.8, 0.5)
# One worker count: the tiles are given (2x2, decode 32,128,128), so 2 and 3 workers run the same plan; the
# set reaching more than one worker is what the fusion counts need.
WORKERS = 2
DIT_KINDS = ("denoise_stage1", "denoise_stage2", "transformer_forward", "dfr_tile")


@pytest.fixture(scope="module")
def loras(tmp_path_factory, tiny_packs):
    return write_user_loras(tmp_path_factory.mktemp("user-loras"), tiny_packs / "tiny")


@pytest.fixture(scope="module")
def lora_farm(redis_server, tmp_path_factory, tiny_packs):
    """A coordinator (its shelf holding the tiny pack) and 2 workers, shared by the module's tests."""
    redis = connect(redis_server.url)
    redis.flushdb()
    data = tmp_path_factory.mktemp("lora-farm")
    (data / "packs").mkdir()
    (data / "packs" / "tiny").symlink_to(tiny_packs / "tiny")
    (data / "client" / "packs").mkdir(parents=True)  # `farm render --local` reads FARM_DATA/packs
    (data / "client" / "packs" / "tiny").symlink_to(tiny_packs / "tiny")
    store = FarmStore(redis)
    with farm(store, data, tiny_packs, workers=WORKERS) as (client, _procs):
        from coordinator.api.auth import load_or_create_token

        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(data), "HF_HOME": str(data / "hf"),
               "FARM_DATA": str(data / "client"), "PYTHONPATH": str(ROOT),
               "FARM_TOKEN": join_token(data, load_or_create_token(data))}
        yield client, store, env, client.address
    redis.close()


def _cli(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=env)


def _lora_args(files, strengths=STRENGTHS) -> list[str]:
    return [x for f, s in zip(files, strengths, strict=True) for x in ("--lora", str(f), str(s))]


def _local(local_runner, files, mode: str, tmp_path) -> dict[str, dict[str, str]]:
    """Task name -> output shas of `farm render --local` with the same set."""
    shas = [file_sha256(f) for f in files]
    local_runner.loras.known.update(dict(zip(shas, files, strict=True)))
    spec = {**SPEC, "lora_mode": mode, "loras": [{"blob": sha, "name": f.name, "strength": s}
                                                 for sha, f, s in zip(shas, files, STRENGTHS, strict=True)]}
    _, outputs, _ = render_local(spec, tmp_path / f"{mode}.mp4", local_runner)
    return {name.removeprefix("local."): out for name, out in outputs.items()}


def _submit(lora_farm, *args: str) -> dict:
    client, _store, env, address = lora_farm
    done = _cli(env, "submit", *BASE, *args, "--coordinator", address)
    assert done.returncode == 0, done.stderr[-3000:]
    return wait_done(client, done.stdout.strip().splitlines()[-1], timeout=600)


def _fusions(render: dict) -> dict[str, list[int]]:
    """Worker -> the `lora_fusions` of each DiT task it ran."""
    out: dict[str, list[int]] = {}
    for t in render["tasks"]:
        if t["kind"] in DIT_KINDS:
            out.setdefault(t["worker"], []).append(int(t["metrics"]["lora_fusions"]))
    return out


def _assert_same_outputs(render: dict, local: dict) -> None:
    farm_outputs = {t["id"].removeprefix(render["id"] + "."): t.get("outputs") or {} for t in render["tasks"]}
    dit = [name for name, t in zip(farm_outputs, render["tasks"], strict=True) if t["kind"] in DIT_KINDS]
    assert len(dit) > 4 and any(".t" in name for name in dit) and "decode.t1" in farm_outputs
    for name, outputs in local.items():
        assert farm_outputs[name] == outputs, f"{name} differs from --local"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["fused", "unfused"])
def test_two_stacked_loras_match_local_and_a_kept_set_fuses_again_zero_times(mode, lora_farm, loras, local_runner,
                                                                                tmp_path):
    args = [*_lora_args(loras), "--lora-mode", mode]
    first = _submit(lora_farm, *args)
    _assert_same_outputs(first, _local(local_runner, loras, mode, tmp_path))
    assert [lora["name"] for lora in first["spec"]["loras"]] == ["style.safetensors", "camera.safetensors"]
    assert first["spec"]["lora_mode"] == mode
    fused = _fusions(first)
    assert all(sum(n) <= 1 for n in fused.values()), fused  # one build of the set per worker, at most
    kept = {w for w, n in fused.items() if sum(n) == 1}
    hub = tmp_path / "hub"  # the second render takes the camera LoRA from a hub repo: the same file, the same set
    hub.mkdir()
    shutil.copy(loras[1], hub / loras[1].name)
    with serve_repo(hub, "studio/camera") as (endpoint, sent):
        _client, _store, env, address = lora_farm
        done = _cli({**env, "HF_ENDPOINT": endpoint}, "submit", *BASE, "--lora", str(loras[0]), str(STRENGTHS[0]),
                    "--lora", "studio/camera", str(STRENGTHS[1]), "--lora-mode", mode, "--coordinator", address)
        assert done.returncode == 0, done.stderr[-3000:]
        assert sent.count(loras[1].name) <= 1  # once into this client's HF cache, never per render
    second = wait_done(lora_farm[0], done.stdout.strip().splitlines()[-1], timeout=600)
    recorded = second["spec"]["loras"][1]
    assert recorded["repo"] == "studio/camera/camera.safetensors"
    assert recorded["blob"] == first["spec"]["loras"][1]["blob"]
    again = _fusions(second)
    assert kept & set(again), (fused, again)
    assert all(sum(again[w]) == 0 for w in kept & set(again)), (fused, again)  # the warm set, not fused again
    print(f"{mode}: first render builds per worker {fused}, second {again}")
    if mode == "fused":  # the CLI's own --local path reads the same client files
        _, _, env, _ = lora_farm
        done = _cli(env, "render", "--local", *BASE, *args, "-o", str(tmp_path / "cli.mp4"),
                    "--save-latents", str(tmp_path / "latents"), timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        farm_latents = latents_from_outputs({t["id"]: t.get("outputs") or {} for t in first["tasks"]}, first["id"],
                                            lambda sha: decode_tensor(lora_farm[0].get_blob(sha)))
        for name, array in farm_latents.items():
            assert np.array_equal(load_file(str(tmp_path / "latents" / f"{name}.safetensors"))["latent"], array), name


def _bad_loras(folder, pack_dir) -> dict[str, tuple]:
    """LoRA files the pack refuses, each with the key its refusal names: a module the pack lacks, a rank
    that differs between the factors, and factors twice as wide (another model's widths)."""
    from safetensors.numpy import save_file

    o, i = tiny_lora_shapes(pack_dir)["transformer_blocks.0.attn1.to_q"]
    rng = np.random.default_rng(3)
    cases = {"nomodule": ("transformer_blocks.7.attn1.to_q", (4, i), (o, 4), "which"),
             "rank": ("transformer_blocks.0.attn1.to_q", (4, i), (o, 3), "rank 4"),
             "width": ("transformer_blocks.0.attn1.to_q", (4, 2 * i), (2 * o, 4), "another model")}
    out = {}
    for name, (module, a, b, words) in cases.items():
        key = f"diffusion_model.{module}.lora_A.weight"
        save_file({key: rng.standard_normal(a).astype(np.float32),
                   key.replace("lora_A", "lora_B"): rng.standard_normal(b).astype(np.float32)},
                  str(folder / f"{name}.safetensors"))
        out[name] = (folder / f"{name}.safetensors", key, words)
    return out


@pytest.mark.timeout(300)
def test_refusals_at_submit_name_the_file_and_key_and_queue_nothing(lora_farm, loras, tiny_packs, tmp_path):
    client, store, env, address = lora_farm
    before = len(store.list_renders())
    bad = _bad_loras(tmp_path, tiny_packs / "tiny")
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "lora.safetensors").write_bytes(b"never served")
    cases = [(["--lora", str(path), "0.7"], [path.name, key, words]) for path, key, words in bad.values()]
    cases += [([x for _ in range(9) for x in ("--lora", str(loras[0]), "0.1")], ["9 LoRAs", "at most 8"]),
              (["--lora", str(loras[0]), "nan"], ["style.safetensors", "not a finite number"]),
              (["--lora", str(loras[1]), "12"], ["camera.safetensors", "outside"]),
              (["--lora", "missing.safetensors", "0.5"], ["missing.safetensors", "no such file on this machine",
                                                          "folder of pack 'tiny'"])]
    with serve_repo(tmp_path / "hub", "studio/gated-style", gated=True) as (endpoint, sent):
        cases.append((["--lora", "studio/gated-style/lora.safetensors", "0.5"], ["is gated", f"{endpoint}/studio"]))
        for args, words in cases:
            done = _cli({**env, "HF_ENDPOINT": endpoint}, "submit", *BASE, *args, "--coordinator", address)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2 and len(lines) == 1, (args[:3], done.stderr[-2000:])
            assert all(w in lines[0] for w in words), (words, lines[0])
            print(lines[0])
        assert sent == []  # the gated repo's file was never sent
    assert len(store.list_renders()) == before  # nothing queued
