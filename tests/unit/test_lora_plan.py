"""User LoRAs in the spec, the plan and the runner: the spec's rules, every DiT task of the
graph carrying the set with its warm name and the fusion's seconds, and a worker whose LoRA file cannot
be had failing the task with the reason while its warm models stay."""

from __future__ import annotations

import pytest

from coordinator.plan.costs import LORA_READ_S, LORA_REQUANTIZE_S, load_seconds
from coordinator.plan.render import normalize_spec, plan_render
from ltx_engine.lora import lora as engine_lora
from protos import spec as spec_rules
from protos.kinds import DIT_KINDS
from protos.lora_set import warm_key
from protos.spec import RenderSpec, SpecError

pytestmark = pytest.mark.timeout(60)

SHA = "ab" * 32
LORAS = [{"blob": SHA, "strength": 0.8, "name": "style.safetensors"}, {"file": "camera.safetensors", "strength": -0.5}]
BASE = {"prompt": "a fox", "height": 128, "width": 256, "frames": 9, "seed": 5, "pack": "tiny",
        "stage2_tiles": "2x2", "tile_overlap": 1}


def test_the_spec_records_the_set_in_order_and_refuses_what_the_engine_would():
    spec = RenderSpec.from_dict({**BASE, "loras": LORAS, "lora_mode": "unfused"})
    assert spec.to_dict()["loras"] == LORAS and spec.to_dict()["lora_mode"] == "unfused"
    assert RenderSpec.from_dict(spec.to_dict()) == spec
    assert RenderSpec().loras == () and RenderSpec().lora_mode == "fused"
    assert spec_rules.MAX_LORAS == engine_lora.MAX_LORAS and spec_rules.LORA_MODES == engine_lora.LORA_MODES
    bad = [([{"strength": 1.0}], "neither or both"), ([{"blob": SHA, "file": "a.safetensors", "strength": 1}], "both"),
           ([{"blob": SHA, "strength": float("inf")}], "not a finite number"),
           ([{"file": "../x.safetensors", "strength": 1}], "file name in the pack folder"),
           ([{"blob": "zz", "strength": 1}], "blob"), ([{"blob": SHA, "strength": 1}] * 9, "at most 8")]
    for loras, words in bad:
        with pytest.raises(SpecError, match=words):
            RenderSpec.from_dict({**BASE, "loras": loras})
    with pytest.raises(SpecError, match="not one of fused, unfused"):
        RenderSpec.from_dict({**BASE, "lora_mode": "merged"})


def test_every_dit_task_carries_the_set_its_warm_name_and_the_fusion_seconds():
    tasks = plan_render(normalize_spec({**BASE, "loras": LORAS}), "r")
    plain = {t["id"]: t for t in plan_render(normalize_spec(BASE), "r")}
    dit = [t for t in tasks if t["kind"] in DIT_KINDS]
    assert {t["kind"] for t in dit} == {"denoise_stage1", "transformer_forward"} and len(dit) == 1 + 4 * 2
    name = warm_key(LORAS, "fused")
    for t in tasks:
        if t["kind"] in DIT_KINDS:
            assert t["params"]["loras"] == LORAS and t["params"]["warm"] == [name]
            fuse = LORA_REQUANTIZE_S + 2 * LORA_READ_S
            assert t["params"]["load_s"] == pytest.approx(load_seconds(t["kind"]) + fuse, abs=1e-3)
        elif t["kind"] != "text_encode":  # the text task: below
            assert "loras" not in t["params"] and t["params"] == plain[t["id"]]["params"]
    assert warm_key(LORAS[::-1], "fused") != name != warm_key(LORAS, "unfused")  # order and mode are the model


def test_a_lora_that_cannot_be_fetched_fails_the_task_and_keeps_the_warm_models(local_runner):
    from worker.loras import LoraFileError

    params = {"pack": "tiny", "frames": 9, "fps": 24.0, "height": 64, "width": 128, "seed": 1, "sigmas": [1.0, 0.0],
              "audio_frames": 10, "loras": [{"blob": SHA, "strength": 0.5, "name": "style.safetensors"}]}
    local_runner.run("decode_audio", {"pack": "tiny"}, _audio_latent(local_runner))
    warm = local_runner.engine.registry.loaded()

    def refuse(sha: str) -> bytes:
        raise OSError("connection reset")

    runner_root, runner_fetch = local_runner.loras.root, local_runner.loras.fetch
    local_runner.loras.root, local_runner.loras.fetch = local_runner.packs_dir / ".unit-loras", refuse
    try:
        with pytest.raises(LoraFileError, match="style.safetensors: fetch of blob ababababab.. failed: connection reset"):
            local_runner.run("denoise_stage1", params, {})
    finally:
        local_runner.loras.root, local_runner.loras.fetch = runner_root, runner_fetch
    assert local_runner.engine.registry.loaded() == warm


def _audio_latent(runner):
    import numpy as np

    cfg = runner.pack("tiny").config.get("audio_vae", {})
    return {"latent": np.zeros((1, int(cfg.get("z_channels", 8)), 4, int(cfg.get("latent_mel_bins", 16))), np.float32)}


def test_farm_plan_counts_the_fusion_seconds(tmp_path):
    """`farm plan --lora` through the real CLI: the set's build is in the predicted wall time, once."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "fleet.toml").write_text('[[workers]]\nname = "m1max"\nchip = "Apple M1 Max"\nmemory_gb = 64\n')
    (tmp_path / "style.safetensors").write_bytes(b"any bytes: plan reads only the name and the sha256")

    def plan(*args: str) -> str:
        done = subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", "plan", "-p", "fox",
                               "-H", "768", "-W", "1280", "-f", "121", "--fleet", str(tmp_path / "fleet.toml"), *args],
                              capture_output=True, text=True, cwd=root, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "FARM_DATA": str(tmp_path / "d"),
                                   "PYTHONPATH": str(root)})
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    def wall(out: str) -> float:
        return float(re.search(r"predicted wall time: ([\d.]+) s", out).group(1))

    plain, with_set = plan(), plan("--lora", str(tmp_path / "style.safetensors"), "0.8", "--lora", "b.safetensors", "0.5")
    assert "LoRA set: 2 fused" in with_set
    assert wall(with_set) - wall(plain) == pytest.approx((LORA_REQUANTIZE_S + 2 * LORA_READ_S) / 1.03, abs=0.5)


def test_a_lora_with_connector_factors_encodes_the_prompt_with_them(local_runner, tiny_packs, tmp_path):
    """The text task of a render with LoRAs carries the set and its own embedding-cache key; its worker
    fuses a LoRA's connector factors into the connector that encodes the prompt, and a set without any
    leaves the embeddings as they were."""
    import numpy as np

    from ltx_engine.loading.pack import Pack
    from ltx_engine.tiny.tiny_loras import TINY_CONNECTOR_MODULE, tiny_lora_factors, write_tiny_lora

    text = [t for t in plan_render(normalize_spec({**BASE, "loras": LORAS}), "r") if t["kind"] == "text_encode"]
    plain = [t for t in plan_render(normalize_spec(BASE), "r") if t["kind"] == "text_encode"]
    assert text[0]["params"]["loras"] == LORAS and text[0]["params"]["text_key"] != plain[0]["params"]["text_key"]
    conn = Pack(tiny_packs / "tiny").tensors("connector")
    shapes = {"transformer_blocks.0.attn1.to_q": (64, 64),
              TINY_CONNECTOR_MODULE: tuple(conn[TINY_CONNECTOR_MODULE + ".weight"].shape)}
    with_conn = write_tiny_lora(tmp_path / "conn.safetensors", tiny_lora_factors(shapes, seed=4), "comfyui", alpha=2.0)
    dit_only = write_tiny_lora(tmp_path / "dit.safetensors", tiny_lora_factors({"transformer_blocks.0.attn1.to_q":
                                                                               (64, 64)}, seed=5))
    local_runner.loras.known.update({"c" * 64: with_conn, "d" * 64: dit_only})

    def encode(*shas: str) -> dict:
        params = {"pack": "tiny", "prompt": "a fox at dusk", "loras": [{"blob": s, "strength": 0.9} for s in shas]}
        return local_runner.run("text_encode", params, {})[0]

    base, dit, both = encode(), encode("d" * 64), encode("c" * 64, "d" * 64)
    assert all(np.array_equal(base[k], dit[k]) for k in base)
    assert not np.array_equal(base["video_context"], both["video_context"])
