"""`farm pack pull` of a pack without a text encoder also fetches the Gemma checkpoint its prompts need,
only the files mlx-lm reads, from a real HTTP hub on 127.0.0.1 (HF_ENDPOINT): into the packs folder under
the repo's name (which workers advertise and renders find by the repo id), or into the Hugging Face
cache; a pulled pack then renders with no `--text-encoder` at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm_cli.local import render_local
from ltx_engine.models.text_encoder import write_tiny_text_encoder
from ltx_engine.rules import text_encoders
from ltx_engine.tiny.tiny_pack import write_tiny_pack
from tests.farm.hub_server import serve_repos
from tests.farm.test_pack_pull import farm, files_of

PACK_REPO = "dgrauet/ltx-2.3-tiny-mlx"
MLX_LM_FILES = {"config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"}


@pytest.mark.timeout(300)
def test_pull_fetches_the_text_encoder_a_published_pack_needs(tmp_path: Path, monkeypatch):
    pack = write_tiny_pack(tmp_path / "pack-repo", seed=0, layout="published-2.3")
    gemma = write_tiny_text_encoder(tmp_path / "gemma-repo", seed=0)
    for extra in ("README.md", "chat_template.json", "preprocessor_config.json"):  # never fetched
        (gemma / extra).write_text("{}\n")
    packs = tmp_path / "packs"
    with serve_repos({PACK_REPO: pack, text_encoders.DEFAULT: gemma}) as (endpoint, sent):
        env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HUB_DISABLE_XET": "1"}
        run = farm(["pack", "pull", PACK_REPO, "--packs-dir", str(packs)], env)
        assert run.returncode == 0, run.stderr[-2000:]
        assert f"pulled text encoder {text_encoders.DEFAULT} into {packs / 'gemma-3-12b-it-4bit'}" in run.stdout
        assert "text_encoder" not in run.stderr  # no "pack has no text_encoder" note: it was fetched
        assert files_of(packs / "gemma-3-12b-it-4bit") == MLX_LM_FILES
        assert not {"README.md", "chat_template.json", "preprocessor_config.json"} & set(sent)
        assert text_encoders.held(packs)["gemma-3-12b-it-4bit"] == (gemma / "model.safetensors").stat().st_size

        sent.clear()
        run = farm(["pack", "pull", PACK_REPO], env)  # into the Hugging Face cache, encoder included
        assert run.returncode == 0, run.stderr[-2000:]
        monkeypatch.setenv("HF_HOME", env["HF_HOME"])
        monkeypatch.delenv("HF_HUB_CACHE", raising=False)
        cached = text_encoders.find_local(text_encoders.DEFAULT, None)
        assert cached is not None and files_of(cached) == MLX_LM_FILES

        run = farm(["pack", "pull", text_encoders.DEFAULT, "--packs-dir", str(tmp_path / "other")], env)
        assert run.returncode == 0 and files_of(tmp_path / "other" / "gemma-3-12b-it-4bit") == MLX_LM_FILES

    from worker.runner import Runner

    spec = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "frame_rate": 24.0, "seed": 3,
            "pack": "ltx-2.3-tiny-mlx"}
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))  # only the packs folder's copy can serve
    _, outputs, _ = render_local(spec, tmp_path / "out.mp4", Runner(packs))
    assert (tmp_path / "out.mp4").stat().st_size > 0 and "local.text" in outputs
