"""`farm pack pull` against a real HTTP hub on 127.0.0.1 (HF_ENDPOINT) and a local folder: only the files
the render kinds need are fetched, and a pull into a full disk (a real file size limit in the child
process) stops with one clear line, leaving nothing a later load would trust. The coordinator's pack
shelf refuses every path outside a pack, over real gRPC."""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from coordinator.api.packs import PackShelf
from protos import farm_pb2, farm_pb2_grpc
from protos.auth import farm_channel
from protos.packpaths import STAGING
from tests.farm.hub_server import serve_repo

ROOT = Path(__file__).resolve().parents[2]
REPO = "dgrauet/ltx-tiny-mlx"
TEXT_ENCODER = {"text_encoder/config.json", "text_encoder/model.safetensors", "text_encoder/special_tokens_map.json",
                "text_encoder/tokenizer.json", "text_encoder/tokenizer_config.json"}
T2V = {"config.json", "embedded_config.json", "split_model.json", "connector.safetensors",
       "transformer-distilled.safetensors", "spatial_upscaler_x2_v1_1.safetensors",
       "spatial_upscaler_x2_v1_1_config.json", "vae_decoder.safetensors", "audio_vae.safetensors",
       "vocoder.safetensors", *TEXT_ENCODER}


def farm(args: list[str], env: dict, limit_bytes: int | None = None) -> subprocess.CompletedProcess:
    def limit() -> None:  # a full disk, for real: writes past the limit fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, timeout=120,
                          preexec_fn=limit if limit_bytes else None)


def files_of(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def hub_env(tmp_path: Path) -> dict:
    return {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}


@pytest.mark.timeout(120)
def test_pull_from_the_hub_fetches_only_what_the_kinds_need(tiny_packs: Path, tmp_path: Path, hub_env: dict):
    source = tiny_packs / "tiny"
    with serve_repo(source, REPO) as (endpoint, sent):
        env = {**hub_env, "HF_ENDPOINT": endpoint}
        run = farm(["pack", "pull", REPO, "--kinds", "i2v", "--packs-dir", str(tmp_path / "packs")], env)
        assert run.returncode == 0, run.stderr[-2000:]
        assert sorted(sent) == sorted(T2V | {"vae_encoder.safetensors"})  # each once; no temporal upscaler
        pack = tmp_path / "packs" / "ltx-tiny-mlx"
        assert files_of(pack) == T2V | {"vae_encoder.safetensors"}
        assert all(sha(pack / f) == sha(source / f) for f in files_of(pack))
        assert not (tmp_path / "packs" / STAGING / "ltx-tiny-mlx").exists()
        sent.clear()
        run = farm(["pack", "pull", REPO, "--kinds", "dfr"], env)  # into the Hugging Face cache
        assert run.returncode == 0, run.stderr[-2000:]
        assert sorted(sent) == sorted(T2V | {"temporal_upscaler_x2_v1_0.safetensors",
                                             "temporal_upscaler_x2_v1_0_config.json"})
        snapshot = Path(run.stdout.strip().split(" into ")[-1])
        assert snapshot.is_relative_to(tmp_path / "hf") and "vae_encoder.safetensors" not in files_of(snapshot)
        assert "Fetching" in run.stderr  # huggingface_hub's own progress bar


@pytest.mark.timeout(120)
def test_pull_from_a_local_folder_copies_only_what_the_kinds_need(tiny_packs: Path, tmp_path: Path):
    run = farm(["pack", "pull", str(tiny_packs / "tiny"), "--packs-dir", str(tmp_path / "packs"), "--name", "t"], {})
    assert run.returncode == 0, run.stderr[-2000:]
    assert files_of(tmp_path / "packs" / "t") == T2V
    run = farm(["pack", "pull", str(tiny_packs / "tiny"), "--kinds", "t2v,x9"], {})
    assert run.returncode == 2 and run.stderr.strip().splitlines()[-1].startswith("farm: unknown render kind 'x9'")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("source", ["hub", "local"])
def test_pull_into_a_full_disk_stops_and_leaves_nothing_trusted(source: str, tiny_packs: Path, tmp_path: Path,
                                                                  hub_env: dict):
    origin = tiny_packs / "tiny"
    packs = tmp_path / "packs"
    with serve_repo(origin, REPO) as (endpoint, _sent):
        ref = REPO if source == "hub" else str(origin)
        args = ["pack", "pull", ref, "--kinds", "i2v", "--packs-dir", str(packs), "--name", "p"]
        env = {**hub_env, "HF_ENDPOINT": endpoint}
        run = farm(args, env, limit_bytes=2_000_000)  # vae_encoder (5.6 MB) cannot be written
        assert run.returncode == 1, run.stderr[-2000:]
        last = run.stderr.strip().splitlines()[-1]
        assert last.startswith("farm: disk full writing") and "nothing partial is loaded" in last
        assert not (packs / "p").exists()  # the pack never appears where workers and loads look
        staged = packs / STAGING / "p"
        for rel in files_of(staged):  # what is staged is whole; no truncated file under a real name
            assert sha(staged / rel) == sha(origin / rel), rel
        assert "vae_encoder.safetensors" not in files_of(staged)
        run = farm(args, env)  # space again: the pull completes (staged files kept) and the pack appears
        assert run.returncode == 0, run.stderr[-2000:]
    assert files_of(packs / "p") == T2V | {"vae_encoder.safetensors"}
    assert sha(packs / "p" / "vae_encoder.safetensors") == sha(origin / "vae_encoder.safetensors")


@pytest.mark.timeout(60)
def test_shelf_serves_only_files_of_its_packs(store, tmp_data: Path, tiny_packs: Path, tmp_path: Path):
    from coordinator.api.auth import auth_metadata, load_or_create_token
    from coordinator.server import serve, stop

    (tmp_path / "secret.txt").write_text("not a pack file")
    shelf = PackShelf(tiny_packs)
    first = shelf.files("tiny")
    assert {f.path for f in first} == files_of(tiny_packs / "tiny")
    assert all(f.sha256 == sha(tiny_packs / "tiny" / f.path) for f in first)
    assert shelf.files("tiny") == first  # from the cache (size and mtime unchanged)
    token = load_or_create_token(tmp_data)
    server, port = serve(store, tmp_data, "127.0.0.1", 0, token, packs_dir=tiny_packs)
    channel = farm_channel(f"127.0.0.1:{port}", token)
    stub, meta = farm_pb2_grpc.FarmPacksStub(channel), auth_metadata(token)
    try:
        names = [p.name for p in stub.ListPacks(farm_pb2.ListPacksRequest(), metadata=meta, timeout=10).packs]
        assert names == ["tiny"]
        ok = stub.GetPackFile(farm_pb2.PackFileRequest(pack="tiny", path="config.json", offset=10), metadata=meta)
        assert b"".join(c.data for c in ok) == (tiny_packs / "tiny" / "config.json").read_bytes()[10:]
        bad = [("tiny", "../tiny/config.json"), ("tiny", "/etc/passwd"), ("tiny", "text_encoder/../../x"),
               ("..", "tiny/config.json"), ("tiny", ".farm-sha256/tiny.json"), ("tiny", "missing.bin"),
               ("tiny", "text_encoder"), (".farm-sha256", "tiny.json"), ("nope", "config.json")]
        for pack, path in bad:
            with pytest.raises(grpc.RpcError) as err:
                list(stub.GetPackFile(farm_pb2.PackFileRequest(pack=pack, path=path), metadata=meta, timeout=10))
            assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), (pack, path)
    finally:
        channel.close()
        stop(server)
