"""`--enhance-prompt`: the planner's enhance task and keys, the LM-head rule, the prompt on the wire.
The farm == --local check is tests/farm/test_text_once.py's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from coordinator.plan.enhance import check_enhancer
from coordinator.plan.graph import SpecError
from coordinator.plan.render import normalize_spec, plan_render, text_key
from ltx_engine.rules import text_encoders
from protos.tensors import prompt_bytes, prompt_text

SPEC = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "seed": 5, "pack": "tiny"}


def _tasks(**extra) -> dict[str, dict]:
    return {t["id"]: t for t in plan_render(normalize_spec({**SPEC, **extra}), "r")}


def test_the_text_task_encodes_what_the_enhance_task_wrote() -> None:
    tasks = _tasks(enhance_prompt=True)
    enhance, text = tasks["r.enhance"], tasks["r.text"]
    assert list(tasks)[:2] == ["r.enhance", "r.text"] and enhance["kind"] == "enhance_prompt"
    assert enhance["params"]["mode"] == "t2v" and enhance["params"]["max_new_tokens"] == 512
    assert text["inputs"] == {"prompt": {"task": "r.enhance", "output": "prompt"}} and text["deps"] == ["r.enhance"]
    assert text["params"]["text_key"] != text_key(normalize_spec(SPEC))  # another prompt: another embedding


def test_without_the_flag_nothing_changes() -> None:
    tasks = _tasks()
    assert "r.enhance" not in tasks and tasks["r.text"]["inputs"] == {}
    assert tasks["r.text"]["params"]["text_key"] == text_key(normalize_spec(SPEC))


def test_greedy_keys_ignore_the_seed_and_follow_the_prompt_and_mode() -> None:
    a, b = _tasks(enhance_prompt=True), _tasks(enhance_prompt=True, seed=6)
    c = _tasks(enhance_prompt=True, prompt="a hare")
    for tid in ("r.enhance", "r.text"):
        assert a[tid]["params"]["text_key"] == b[tid]["params"]["text_key"] != c[tid]["params"]["text_key"]


def test_a_guided_renders_negative_prompt_is_encoded_as_given() -> None:
    tasks = _tasks(enhance_prompt=True, pack="dev", pipeline="one-stage", steps=2, negative_prompt="blurry",
                   height=64, width=64)
    assert tasks["r.negative"]["inputs"] == {} and tasks["r.negative"]["params"]["prompt"] == "blurry"


def test_a_pack_without_an_lm_head_is_refused_with_the_download() -> None:
    plan = normalize_spec({**SPEC, "enhance_prompt": True}).resolve(text_encoder="pack", generation="2.3")
    check_enhancer(plan, True)
    check_enhancer(plan, None)  # nobody described the pack: the worker checks
    with pytest.raises(SpecError, match=r"has no LM head .*`hf download mlx-community/gemma-3-12b-it-4bit "
                                        r"--local-dir tiny/text_encoder`"):
        check_enhancer(plan, False)
    check_enhancer(plan.resolve(text_encoder="mlx-community/gemma-3-12b-it-4bit"), False)  # a separate one writes


def test_the_lm_head_rule_reads_config_and_headers(tmp_path) -> None:
    folder = tmp_path / "g"
    folder.mkdir()
    config = {"model_type": "gemma3_text", "tie_word_embeddings": True}
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"model.embed_tokens.weight": np.zeros((4, 2), np.float32)}, str(folder / "model.safetensors"))
    assert text_encoders.lm_head_problem(folder) is None
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    assert "lm_head.weight" in text_encoders.lm_head_problem(folder)
    save_file({"lm_head.weight": np.zeros((4, 2), np.float32)}, str(folder / "head.safetensors"))
    assert text_encoders.lm_head_problem(folder) is None


def test_a_prompt_travels_as_its_utf8_bytes() -> None:
    text = "un renard — 狐 🦊"
    array = prompt_bytes(text)
    assert array.dtype == np.uint8 and prompt_text(array) == text
