"""Dub-It's graph (`coordinator/plan/control.py`) with a tiled stage 2: `stage2.prep` takes
the stage-2 reference video and stage 1's audio as audio reference, every tile forward runs with the
Dub-It LoRA, and the coordinator's cut of prep's state (the engine's own state builder, the reducer's
own cut) hands every tile the reference tokens overlapping it, with the audio reference in prep's audio.
No model, no farm."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.plan import render as planner
from coordinator.reduce.reducer import run_reduce_task
from ltx_engine.denoise import StageInputs, build_stage_states
from ltx_engine.media_stage import stage_fields
from protos.spec import RenderSpec

pytestmark = pytest.mark.timeout(60)
LORA = {"blob": "cd" * 32, "strength": 1.0, "downscale": 2, "name": "dubit.safetensors"}
SPEC = {
    "prompt": "a fox",
    "height": 128,
    "width": 128,
    "frames": 25,
    "frame_rate": 24.0,
    "seed": 5,
    "pack": "tiny",
    "encode_tiles": "24,128",
    "tile_overlap": 1,
    "stage2_tiles": "1x2",
    "dub_video": {"blob": "ab" * 32, "name": "talk.mp4"},
    "ic_lora": LORA,
}


def _tasks(**extra) -> dict[str, dict]:
    plan = planner.validate_spec(RenderSpec.from_dict({**SPEC, **extra}), [])
    return {t["id"].removeprefix("r."): t for t in planner.plan_render(plan, "r")}


def test_tiled_dub_stage2_prep_takes_both_references_and_every_tile_the_lora():
    tasks = _tasks()
    prep, control = tasks["stage2.prep"], {"strength": 1.0, "downscale": 2, "attention_strength": 1.0}
    assert prep["inputs"]["control_latent"] == {"task": "r.dub_s2", "output": "latent"}
    assert prep["inputs"]["audio_reference"] == {"task": "r.stage1", "output": "audio_latent"}
    assert prep["params"]["control"] == control and "loras" not in prep["params"]  # prep loads no DiT
    assert {"r.dub_s2", "r.stage1"} <= set(prep["deps"])
    forwards = [
        t for name, t in tasks.items() if name.startswith("stage2.s") and t["kind"] == "transformer_forward"
    ]
    assert len(forwards) == 2 * 2  # 1x2 tiles x the TDP schedule's 2 steps
    for t in forwards:
        assert [lora["name"] for lora in t["params"]["loras"]] == ["dubit.safetensors"]
        assert (t["params"]["lora_mode"], t["params"]["warm"]) == ("fused", tasks["stage1"]["params"]["warm"])
        audio = {t["inputs"][k]["task"] for k in ("audio_latent", "audio_mask", "audio_positions")}
        assert audio == {"r.stage2.prep"}  # prep's whole audio, its reference included
    # the coordinator's cut and steps (they blend video only): no DiT, no LoRA
    steps = [t for t in tasks.values() if t["kind"] in ("tdp_cut", "tdp_step")]
    assert len(steps) == 3 and not any(t["params"].get("loras") for t in steps)
    assert tasks["decode"]["inputs"]["latent"] == {"task": "r.stage2", "output": "video_latent"}
    assert tasks["audio"]["inputs"]["latent"] == {"task": "r.stage1", "output": "audio_latent"}
    untiled = _tasks(stage2_tiles=None)["stage2"]  # the untiled stage 2: the one task with all of it
    assert untiled["kind"] == "denoise_stage2" and untiled["params"]["control"] == control
    assert untiled["inputs"]["control_latent"] == prep["inputs"]["control_latent"]
    assert untiled["inputs"]["audio_reference"] == prep["inputs"]["audio_reference"]


def test_the_cut_hands_every_tile_its_reference_tokens():
    tasks = _tasks()
    prep, cut = tasks["stage2.prep"]["params"], tasks["stage2.cut"]["params"]
    rng = np.random.default_rng(3)
    # stage 2's reference: 128 px over downscale 2, 2x2 latent cells
    reference = rng.standard_normal((1, 128, 4, 2, 2)).astype(np.float32)
    audio = rng.standard_normal((1, 8, prep["audio_frames"], 16)).astype(np.float32)
    arrays = {"control_latent": reference, "audio_reference": audio}
    inputs = StageInputs(
        frames=prep["frames"],
        height=prep["height"],
        width=prep["width"],
        fps=prep["fps"],
        seed=prep["seed"],
        sigmas=prep["sigmas"],
        contexts={},
        audio_frames=prep["audio_frames"],
        noise_stream=1,
        initial_video=rng.standard_normal((1, 128, 4, 4, 4)).astype(np.float32),
        initial_audio=audio,
        **stage_fields(prep, {k: a for k, a in arrays.items() if k in tasks["stage2.prep"]["inputs"]}),
    )  # as the worker's `_stage` reads prep's params and inputs
    video, state_audio = build_stage_states(inputs, 128)
    generated, ref_tokens = 4 * 4 * 4, 4 * 2 * 2
    assert video.num_tokens == generated + ref_tokens and state_audio.num_tokens == 2 * audio.shape[2]
    state = {"latent": video.latent, "clean": video.clean_latent, "mask": video.denoise_mask}
    out = run_reduce_task("tdp_cut", cut, {**state, "positions": video.positions})
    kept = []
    for i in range(2):
        tile = out[f"t{i}_latent"]
        box = tasks[f"stage2.s0.t{i}"]["params"]["tile"]
        own = int(np.prod([e - s for s, e in box.values()]))
        assert tile.shape[1] > own  # the tile's generated tokens, then reference tokens
        kept.append({tuple(row) for row in tile[0, own:].round(6)})
        assert not out[f"t{i}_timesteps"][0, own:].any()  # strength 1: the reference is clean (mask 0)
    everything = {tuple(row) for row in video.latent[0, generated:].round(6)}
    assert kept[0] | kept[1] == everything and kept[0] != kept[1]  # each its half, the overlap in both


@pytest.mark.parametrize("clip", ["dub", "control"])
def test_a_reference_stage1_asked_to_gang_carries_its_degree_table_and_reference(clip):
    """`--stage1-parallel 2` on Dub-It and IC-LoRA control (attention strength 0.5): stage 1 keeps its gang
    request and the table the lease reads, beside its reference inputs and the IC-LoRA."""
    extra = {} if clip == "dub" else {"dub_video": None, "height": 256, "width": 256, "encode_tiles": "24,96",
                                      "control_video": {"blob": "ab" * 32, "attention_strength": 0.5}}
    stage1 = _tasks(stage1_parallel="2", **extra)["stage1"]
    assert stage1["params"]["stage1_parallel_request"] == "2"
    assert stage1["params"]["stage1_degrees"] == [1] + [2] * 7
    assert "control_latent" in stage1["inputs"] and stage1["params"]["loras"][-1]["name"] == "dubit.safetensors"
    assert ("audio_reference" in stage1["inputs"]) == (clip == "dub")
    assert _tasks()["stage1"]["params"]["stage1_degrees"] == [1]  # auto on a tiny stage 1: never a gang
