"""The text encoder of a render: the rule that picks it, where a machine finds it (folders, names in the
packs folder, the Hugging Face cache, offline), what a worker advertises, the planner's record and
refusal, its weight bytes in the model budget, and the embeddings kept per (pack, encoder, prompt)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from coordinator.plan.render import SpecError, normalize_spec, plan_render, validate_spec
from ltx_engine.models.text_encoder import write_tiny_text_encoder
from ltx_engine.rules import text_encoders

SPEC = {"prompt": "a fox", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 3}
ALL = ["connector", "transformer", "spatial_upscaler", "vae_decoder", "audio_vae", "vocoder"]
# The files of mlx-community/gemma-3-12b-it-4bit as the hub lists them (names only).
GEMMA_REPO = [".gitattributes", "README.md", "added_tokens.json", "chat_template.json", "config.json",
              "generation_config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
              "model.safetensors.index.json", "preprocessor_config.json", "processor_config.json",
              "special_tokens_map.json", "tokenizer.json", "tokenizer.model", "tokenizer_config.json"]


def hf_cache_repo(cache: Path, repo: str, source: Path) -> Path:
    """`source` as the hub cache holds a repo: blobs by sha256, a snapshot of relative links, refs/main."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    commit = hashlib.sha1(repo.encode()).hexdigest()
    snapshot = folder / "snapshots" / commit
    (folder / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    for path in sorted(source.iterdir()):
        blob = folder / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(Path("..", "..", "blobs", blob.name))
    return snapshot


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> Path:
    return write_tiny_text_encoder(tmp_path_factory.mktemp("enc") / "tiny-gemma", seed=0)


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("LTX_GEMMA_DIR", raising=False)
    return cache


def test_the_pack_tower_wins_then_the_choice_then_the_mlx_default():
    assert text_encoders.resolve(True, "org/other") == text_encoders.PACK
    assert text_encoders.resolve(False, "org/other") == "org/other"
    assert text_encoders.resolve(False, None) == "mlx-community/gemma-3-12b-it-4bit"
    assert text_encoders.resolve(None, None) is None  # the pack is not described: the worker applies the rule
    assert text_encoders.names("mlx-community/gemma-3-12b-it-4bit") == ["mlx-community/gemma-3-12b-it-4bit",
                                                                        "gemma-3-12b-it-4bit"]
    assert text_encoders.names("/models/gemma") == ["/models/gemma"]


def test_a_pull_takes_only_what_mlx_lm_reads():
    assert text_encoders.is_encoder_listing(GEMMA_REPO)
    assert not text_encoders.is_encoder_listing(["config.json", "embedded_config.json", "connector.safetensors"])
    assert text_encoders.pull_files(GEMMA_REPO) == [
        "added_tokens.json", "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json", "special_tokens_map.json", "tokenizer.json", "tokenizer.model",
        "tokenizer_config.json"]


def test_found_as_a_folder_a_packs_folder_name_and_a_cached_repo(gemma, hub, tmp_path):
    packs = tmp_path / "packs"
    packs.mkdir()
    assert text_encoders.find_local(str(gemma), None) == gemma
    assert text_encoders.find_local("tiny-gemma", packs) is None
    shutil.copytree(gemma, packs / "tiny-gemma")
    assert text_encoders.find_local("tiny-gemma", packs) == packs / "tiny-gemma"
    assert text_encoders.find_local("someone/tiny-gemma", packs) == packs / "tiny-gemma"  # pulled by repo name
    assert text_encoders.find_local("farm/cached-gemma", packs) is None
    snapshot = hf_cache_repo(hub, "farm/cached-gemma", gemma)
    assert text_encoders.find_local("farm/cached-gemma", packs) == snapshot
    assert text_encoders.find_local("farm/cached-gemma", None) == snapshot
    (packs / "tiny").mkdir()
    (packs / "tiny" / "embedded_config.json").write_text("{}")
    (packs / "tiny" / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    assert text_encoders.find_local("tiny", packs) is None  # a pack is never taken for an encoder


def test_a_worker_advertises_each_name_with_its_weight_bytes(gemma, hub, tmp_path, monkeypatch):
    packs = tmp_path / "packs"
    packs.mkdir()
    shutil.copytree(gemma, packs / "tiny-gemma")
    hf_cache_repo(hub, "farm/cached-gemma", gemma)
    size = (gemma / "model.safetensors").stat().st_size
    held = text_encoders.held(packs)
    assert held == {"tiny-gemma": size, str((packs / "tiny-gemma").resolve()): size, "farm/cached-gemma": size}
    monkeypatch.setenv("LTX_GEMMA_DIR", str(gemma))  # the single-file checkpoints' alias
    assert text_encoders.held(None) == {"farm/cached-gemma": size, str(gemma.resolve()): size}


def _worker(pack_components: list[str], encoders: dict | None) -> dict:
    worker = {"packs": ["p"], "memory_bytes": 2**40, "pack_components": {"p": pack_components}}
    return worker if encoders is None else {**worker, "text_encoders": encoders}


def test_the_spec_records_the_encoder_and_the_text_task_names_it():
    spec = normalize_spec({**SPEC, "pack": "p"})
    spec = validate_spec(spec, [_worker(ALL, {"gemma-3-12b-it-4bit": 7})])  # held as a pulled folder's name
    assert spec.text_encoder == text_encoders.DEFAULT
    text = plan_render(spec, "r")[0]
    assert text["params"]["needs"] == ["connector"]
    assert text["params"]["text_encoder_names"] == [text_encoders.DEFAULT, "gemma-3-12b-it-4bit"]
    own = normalize_spec({**SPEC, "pack": "p", "text_encoder": "org/other"})
    own = validate_spec(own, [_worker(["text_encoder", *ALL], {})])  # the pack's own tower wins
    assert own.text_encoder == "pack" and plan_render(own, "r")[0]["params"]["needs"] == ["text_encoder", "connector"]


def test_no_live_worker_holding_the_encoder_refuses_in_one_line():
    spec = normalize_spec({**SPEC, "pack": "p", "text_encoder": "org/gemma"})
    with pytest.raises(SpecError) as info:
        spec = validate_spec(spec, [_worker(ALL, {"other/gemma": 1}), _worker(ALL, {})])
    assert str(info.value) == ("no live worker holds the text encoder 'org/gemma' that pack 'p' needs: "
                               "fetch it with `farm pack pull org/gemma`")
    validate_spec(normalize_spec({**SPEC, "pack": "p", "text_encoder": "org/gemma"}), [_worker(ALL, None)])  # silent
    with pytest.raises(SpecError, match="not a repo id"):
        normalize_spec({**SPEC, "text_encoder": "  "})


def test_the_encoder_counts_in_the_model_budget_before_it_loads(tiny_packs, gemma):
    from ltx_engine.engine import Engine
    from ltx_engine.loading.pack import open_pack
    from ltx_engine.loading.registry import ModelRegistry

    pack = open_pack(tiny_packs / "tiny")
    incoming = text_encoders.weight_bytes(gemma)
    for spare, kept in ((0, True), (-1, False)):
        registry = ModelRegistry()
        engine = Engine(registry)
        engine.model(pack, "vae_decoder")  # warm, and not needed by a text task
        loaded = sum(registry._bytes.values())
        registry.budget_bytes = loaded + incoming + spare
        engine.prepare(pack, ("text_encoder", "connector"), gemma)  # a text task's components
        assert ("vae_decoder" in registry.loaded()) is kept


def test_embeddings_are_kept_per_pack_encoder_and_prompt(tiny_packs, gemma, tmp_path):
    from worker.runner import Runner

    other = write_tiny_text_encoder(tmp_path / "other-gemma", seed=1)
    runner = Runner(tiny_packs)
    params = {"pack": "tiny", "prompt": "a fox", "text_encoder": str(gemma)}
    first, _ = runner.run("text_encode", params, {})
    loads = runner.engine.registry.load_seconds
    again, _ = runner.run("text_encode", params, {})
    assert runner.engine.registry.load_seconds == loads and all(np.array_equal(first[k], again[k]) for k in first)
    own, _ = runner.run("text_encode", {**params, "text_encoder": "pack"}, {})  # the tiny pack's tower: same weights
    assert all(np.array_equal(first[k], own[k]) for k in first)
    changed, _ = runner.run("text_encode", {**params, "text_encoder": str(other)}, {})
    assert not np.array_equal(first["video_context"], changed["video_context"])


def test_pack_list_shows_each_workers_encoders_once():
    from farm_cli.packs import encoder_rows

    workers = [{"id": "w1", "text_encoders": {"tiny-gemma": 10, "/p/packs/tiny-gemma": 10, "/opt/gemma": 5}},
               {"id": "w2", "info": {"text_encoders": {"org/g": 7}}}]
    assert encoder_rows(workers) == [{"worker": "w1", "text_encoder": "/opt/gemma", "bytes": 5},
                                     {"worker": "w1", "text_encoder": "tiny-gemma", "bytes": 10},
                                     {"worker": "w2", "text_encoder": "org/g", "bytes": 7}]


def test_doctor_checks_the_encoder_a_published_pack_needs(gemma, hub, tmp_path):
    from farm_cli import doctor
    from ltx_engine.tiny.tiny_pack import write_tiny_pack

    packs, data = tmp_path / "packs", tmp_path / "data"
    write_tiny_pack(packs / "published", seed=0, layout="published-2.3")
    assert doctor.check_pack("published", packs)[0] == "ok"  # no tower is no longer a missing part
    status, message = doctor.check_text_encoder("published", packs, None, data)
    assert status == "fail" and message.endswith("fetch it with `farm pack pull mlx-community/gemma-3-12b-it-4bit`")
    assert doctor.check_text_encoder("published", packs, lambda: [{"name": "gemma-3-12b-it-4bit"}], data)[0] == "ok"
    (data / "config.toml").write_text(f'[text_encoders]\npublished = "{gemma}"\n')
    status, message = doctor.check_text_encoder("published", packs, None, data)
    assert status == "ok" and str(gemma) in message


def test_farm_status_shows_the_recorded_encoder():
    from farm_cli.views import render_details

    render = {"id": "r1", "state": "queued", "spec": {**SPEC, "pack": "ltx-2.3-mlx-q8", "text_encoder": text_encoders.DEFAULT}}
    assert f"  encoder    {text_encoders.DEFAULT}" in render_details(render)
    assert "  encoder    the pack's own" in render_details({**render, "spec": {**SPEC, "text_encoder": "pack"}})
