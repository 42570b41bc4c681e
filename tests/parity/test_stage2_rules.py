"""The dev two-stage recipes' stage 2 as planned follows upstream main's rules (written once in
upstream_rules.py): audio re-noised and denoised beside the video but the render decodes stage 1's, and
the stage's DiT is the dev one with the user's LoRAs then the distilled LoRA at the stage's strength."""

import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

from coordinator.plan.render import normalize_spec, plan_render, validate_spec  # noqa: E402
from tests.parity.upstream_rules import stage2_audio_main  # noqa: E402

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
    stage1_audio, stage2_audio = ({"task": f"r.{s}", "output": "audio_latent"} for s in ("stage1", "stage2"))
    assert tasks["r.audio"]["inputs"]["latent"] == stage2_audio_main(stage1_audio, stage2_audio)
    # STAGE2_AUDIO_MAIN's "discarded": no task of the render reads stage 2's audio latent.
    assert not [t["id"] for t in tasks.values() if stage2_audio in t["inputs"].values()]
    prep_or_stage = tasks.get("r.stage2.prep", tasks["r.stage2"])
    assert prep_or_stage["params"]["renoise_audio"] is True  # denoised beside the video
    dit = [t for t in tasks.values() if t["kind"] in ("guidance_pass", "denoise_stage2")]
    for stage, strength in zip(("stage1", "stage2"), strengths, strict=True):
        ours = [t for t in dit if t["id"].startswith(f"r.{stage}")]
        assert ours and {t["params"].get("distilled_lora_strength") for t in ours} == {strength}
        assert all(t["params"]["loras"] == spec["loras"] for t in ours)  # the user's set under it
