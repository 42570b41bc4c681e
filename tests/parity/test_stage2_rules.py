"""The dev two-stage recipes' stage 2 as planned follows upstream main's rules (written once in
upstream_rules.py): audio re-noised and denoised beside the video but the render decodes stage 1's, and
the stage's DiT is the dev one with the user's LoRAs then the distilled LoRA at the stage's strength."""

import pytest

from coordinator.plan.render import normalize_spec, plan_render, validate_spec

pytest.importorskip("torch")  # upstream_rules imports ltx-core 1.0.0 (CI=true installs it)
from tests.parity.upstream_rules import STAGE2_AUDIO_MAIN, stage2_audio_main  # noqa: E402

pytestmark = pytest.mark.timeout(60)
BASE = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "pack": "dev", "decode_tiles": "off"}


@pytest.mark.parametrize("pipeline,strengths", [("two-stage", (None, 1.0)), ("two-stage-hq", (0.25, 0.5))])
def test_stage2_follows_main(pipeline, strengths):
    spec = {
        **BASE,
        "pipeline": pipeline,
        "steps": 2,
        "stage2_steps": 1,
        "loras": [{"file": "s.safetensors", "strength": 1}],
    }
    tasks = {t["id"]: t for t in plan_render(validate_spec(normalize_spec(spec), []), "r")}
    assert "discarded: stage 1's decoded" in STAGE2_AUDIO_MAIN
    assert tasks["r.audio"]["inputs"]["latent"] == stage2_audio_main(
        {"task": "r.stage1", "output": "audio_latent"}, {"task": "r.stage2", "output": "audio_latent"}
    )
    prep_or_stage = tasks.get("r.stage2.prep", tasks["r.stage2"])
    assert prep_or_stage["params"]["renoise_audio"] is True  # denoised beside the video
    dit = [t for t in tasks.values() if t["kind"] in ("guidance_pass", "denoise_stage2")]
    for stage, strength in zip(("stage1", "stage2"), strengths, strict=True):
        ours = [t for t in dit if t["id"].startswith(f"r.{stage}")]
        assert ours and {t["params"].get("distilled_lora_strength") for t in ours} == {strength}
        assert all(t["params"]["loras"] == spec["loras"] for t in ours)  # the user's set under it
