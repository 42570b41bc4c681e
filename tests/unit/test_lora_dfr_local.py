"""User LoRAs on an LTX-2.5 DFR render in-process: stage 1, stage 2 (with the detailing
IC-LoRA in the same sum when fused, or the set's adapters on the detailed DiT when unfused) and the
temporal round tiles all run with the set. On the tiny 2.5 pack (bf16 weights): the set moves every
DiT task's output, and fused and unfused agree to far better than the set's effect."""

from __future__ import annotations

import numpy as np
import pytest

from farm_cli.local import render_local
from ltx_engine.lora.lora import file_sha256
from ltx_engine.tiny.tiny_pack import DETAILING_LORA
from tests.farm.user_loras import write_user_loras
from tests.session_fixtures import link_packs

pytestmark = pytest.mark.timeout(300)

SPEC = {"prompt": "a fox", "height": 128, "width": 192, "frames": 41, "frame_rate": 24.0, "seed": 5,
        "pack": "tiny25", "decode_tiles": "off", "temporal_upscalings": 1, "audio": False,
        "detailing_lora": DETAILING_LORA}
DIT = ("stage1", "stage2", "dfr.r1.t0", "dfr.r1.t1")


def test_every_dfr_dit_task_runs_with_the_set_fused_or_unfused(tiny25_pack, tmp_path_factory):
    from worker.runner import Runner

    packs = link_packs(tmp_path_factory.mktemp("packs25"), tiny25=tiny25_pack)
    files = write_user_loras(tmp_path_factory.mktemp("loras25"), packs / "tiny25", scale=0.2)
    runner = Runner(packs)
    shas = [file_sha256(f) for f in files]
    runner.loras.known.update(dict(zip(shas, files, strict=True)))
    loras = [{"blob": sha, "strength": s} for sha, s in zip(shas, (0.8, 0.5), strict=True)]
    out, events = {}, []
    for mode in ("none", "fused", "unfused"):
        spec = SPEC if mode == "none" else {**SPEC, "loras": loras, "lora_mode": mode}
        _, outputs, blobs = render_local(spec, tmp_path_factory.mktemp(mode) / "r.mp4", runner,
                                         on_event=events.append)
        out[mode] = {name: blobs.get(outputs[f"local.{name}"]["video_latent" if "dfr" not in name else "latent"])
                     for name in DIT}
    builds = [e.get("lora_fusions") for e in events if e.get("type") == "task_done" and "lora_fusions" in e]
    assert sum(builds) == 4, builds  # fused: the plain set + the set with detailing; unfused: the same two
    for name in DIT:
        none, fused, unfused = (out[m][name].astype(np.float64) for m in ("none", "fused", "unfused"))
        effect, gap = np.linalg.norm(unfused - none), np.linalg.norm(fused - unfused)
        print(f"{name}: effect {effect / np.linalg.norm(none):.3e}, fused vs unfused {gap / np.linalg.norm(none):.3e}")
        assert effect > 1e-3 * np.linalg.norm(none), name
        assert gap < 0.2 * effect, name
