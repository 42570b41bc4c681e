"""Which LTX generation a pack holds, recorded once per render, and the stage-1 sampler it selects
(upstream's `should_use_ancestral_sampler`): real tiny packs, a real Runner, the real planner."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import SpecError
from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from ltx_engine.loading.pack import Pack
from ltx_engine.rules import sampling
from ltx_engine.rules.generation import detect_generation, parse_version, stage1_sampler, stage2_sampler
from tests.session_fixtures import link_packs


@pytest.mark.parametrize(("text", "parsed"), [
    ("2.5.0", (2, 5, 0)), ("2.4-rc2", (2, 4)), ("v2.3", (2, 3)), ("2.3.rc1", (2, 3)), ("", ()), (None, ()),
    ("unknown", ()),
])
def test_versions_parse_as_upstream_compares_them(text, parsed):
    assert parse_version(text) == parsed


def test_recorded_version_wins_then_the_dits_keyframe_marker():
    assert detect_generation(["2.5.0"], {}, []) == "2.5"
    assert detect_generation(["2.6"], {}, []) == "2.5"  # newer generations inherit the closest known one
    assert detect_generation(["2.3.0"], {"use_keyframes_abs_pos_embedding": True}, []) == "2.3"
    assert detect_generation([None, "unknown"], {}, ["keyframes_abs_pos_embedding"]) == "2.5"
    assert detect_generation([], {"use_keyframes_abs_pos_embedding": True}, []) == "2.5"
    assert detect_generation([], {}, ["transformer_blocks.0.attn1.to_q.weight"]) == "2.3"


def test_ltx25_samples_every_stage_ancestrally_as_upstream_after_1_2_0():
    """1.2.0 kept DFR's stage 1 and every stage 2 on Euler; upstream v1.4+ (tests/parity/upstream_rules.py)."""
    assert stage1_sampler("2.5", dfr=False) == sampling.EULER_ANCESTRAL
    assert stage1_sampler("2.5", dfr=True) == sampling.EULER_ANCESTRAL
    assert stage2_sampler("2.5") == sampling.EULER_ANCESTRAL
    assert stage1_sampler("2.3", dfr=False) == stage2_sampler("2.3") == sampling.EULER
    with pytest.raises(ValueError, match="unknown LTX generation"):
        stage1_sampler("3.0", dfr=False)


@pytest.fixture(scope="module")
def packs(tiny25_pack, tiny_packs, tmp_path_factory):
    folder = link_packs(tmp_path_factory.mktemp("gen-packs"), tiny23=tiny_packs / "tiny", tiny25=tiny25_pack)
    shutil.copytree(tiny25_pack, folder / "bare25")  # a copy: its files change below
    for name in ("config.json", "split_model.json"):  # a pack that records no version: read from its DiT
        path = folder / "bare25" / name
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "model_version"}))
    (folder / "bare25" / "duration_head.safetensors").unlink()  # and no length head
    cfg = folder / "bare25" / "embedded_config.json"
    embedded = json.loads(cfg.read_text())
    embedded["transformer"].pop("use_keyframes_abs_pos_embedding")
    cfg.write_text(json.dumps(embedded))
    return folder


def test_packs_and_workers_report_their_generation(packs):
    from worker.runner import Runner

    assert Pack(packs / "tiny23").generation == "2.3"
    assert Pack(packs / "tiny25").generation == "2.5"
    assert Pack(packs / "bare25").generation == "2.5"  # the keyframe marker's weight key alone
    caps = Runner(packs).capabilities()
    assert caps["pack_generation"] == {"bare25": "2.5", "tiny23": "2.3", "tiny25": "2.5"}


def _fleet(generations: list[str]) -> list[dict]:
    return [{"packs": ["p"], "pack_generation": {"p": g}, "memory_bytes": 2**40} for g in generations]


def test_the_planner_records_the_generation_once_and_picks_stage_1s_sampler():
    spec = normalize_spec({"prompt": "a fox", "pack": "p", "frames": 25, "generation": "2.5"})
    assert spec.generation is None  # resolved, never taken from a request
    spec = validate_spec(spec, _fleet(["2.5", "2.5"]))
    assert spec.generation == "2.5"
    stage1 = next(t for t in plan_render(spec, "r") if t["kind"] == "denoise_stage1")
    assert stage1["params"]["sampler"] == sampling.EULER_ANCESTRAL
    old = normalize_spec({"prompt": "a fox", "pack": "p"})
    old = validate_spec(old, _fleet(["2.3"]))
    assert next(t for t in plan_render(old, "r") if t["kind"] == "denoise_stage1")["params"]["sampler"] == "euler"
    unknown = normalize_spec({"prompt": "a fox", "pack": "p"})
    unknown = validate_spec(unknown, [])
    assert unknown.generation is None
    assert "sampler" not in next(t for t in plan_render(unknown, "r") if t["kind"] == "denoise_stage1")["params"]
    with pytest.raises(SpecError, match="workers disagree on the LTX generation of pack 'p'"):
        validate_spec(normalize_spec({"prompt": "a fox", "pack": "p", "frames": 25}), _fleet(["2.3", "2.5"]))


@pytest.mark.timeout(300)
def test_ancestral_stage_1_is_seeded_apart_and_deterministic(packs):
    """Stage 1 on the tiny 2.5 pack: ancestral differs from Euler and repeats bit for bit; its re-noise
    is keyed by seed + ANCESTRAL_NOISE_SEED_OFFSET (10000, upstream's), eta 1."""
    from ltx_engine.denoise import StageInputs
    from worker.runner import Runner

    stepping = StageInputs(9, 64, 64, 24.0, 3, [1.0, 0.0], {}, sampler=sampling.EULER_ANCESTRAL).ancestral()
    assert (stepping.seed, stepping.eta) == (10003, 1.0)

    runner = Runner(packs)
    text, _ = runner.run("text_encode", {"pack": "tiny25", "prompt": "a fox"}, {})
    params = {"pack": "tiny25", "seed": 3, "frames": 9, "fps": 24.0, "height": 64, "width": 64,
              "sigmas": list(sampling.DISTILLED_SIGMAS), "audio_frames": 9}
    euler, _ = runner.run("denoise_stage1", {**params, "sampler": "euler"}, text)
    ancestral, _ = runner.run("denoise_stage1", {**params, "sampler": "euler_ancestral"}, text)
    again, _ = runner.run("denoise_stage1", params, text)  # no sampler recorded: the pack's generation picks
    assert not np.array_equal(euler["video_latent"], ancestral["video_latent"])
    for name in ancestral:
        np.testing.assert_array_equal(ancestral[name], again[name])


def test_a_25_pack_serves_its_vae_from_the_conv_files(packs):
    """2.5 packs name the conv VAE `vae_decoder_conv` / `vae_encoder_conv` (keys under that prefix)."""
    from ltx_engine.rules.components import pull_files, resolve_files

    pack = Pack(packs / "tiny25")
    assert not (pack.root / "vae_decoder.safetensors").exists()
    assert pack.layout.found["vae_decoder"].files == ("vae_decoder_conv.safetensors",)
    assert pack.layout.found["vae_encoder"].prefix == "vae_encoder_conv"
    assert {"vae_decoder", "vae_encoder"} <= set(pack.components())
    decoder = pack.tensors("vae_decoder")
    assert decoder and not any(k.startswith("vae_decoder") for k in decoder)  # the prefix is stripped
    names = [p.name for p in pack.root.iterdir()]
    assert "vae_encoder_conv.safetensors" in pull_files(names, ["vae_encoder"])
    both = resolve_files(["vae_decoder.safetensors", "vae_decoder_conv.safetensors"])
    assert both.found["vae_decoder"].stem == "vae_decoder"  # 2.3's name wins where a pack has both


def test_a_left_out_length_on_25_plans_the_duration_head_first_and_defaults_for_23():
    """2.5 without -f: phase 1 is the text task, the DurationHead task on its outputs and the coordinator
    task that plans the rest; a fleet whose pack has no head refuses it in one line; 2.3 takes 25."""
    from coordinator.plan.render import continue_render

    spec = normalize_spec({"prompt": "a fox", "pack": "p"})
    assert spec.frames is None
    spec = validate_spec(spec, _fleet(["2.5"]))
    assert spec.frames is None and spec.generation == "2.5"
    tasks = plan_render(spec, "r")
    assert [(t["id"], t["kind"], t["capability"]) for t in tasks] == [
        ("r.text", "text_encode", "mlx"), ("r.length.head", "predict_duration", "mlx"),
        ("r.length.plan", "plan_length", "coordinator")]
    assert tasks[1]["inputs"]["video_context"] == {"task": "r.text", "output": "video_context"}
    assert tasks[2]["params"]["spec"]["frames"] is None
    full_spec, full = continue_render(tasks[2]["params"]["spec"], 49, 2.01, "r", Fleet.of(_fleet(["2.5"])))
    assert full_spec["frames"] == 49 and full_spec["predicted_seconds"] == 2.01
    assert full[0] == {**tasks[0], "params": {**tasks[0]["params"], "cost_s": full[0]["params"]["cost_s"]}}
    stage1 = next(t for t in full if t["kind"] == "denoise_stage1")
    assert stage1["params"]["frames"] == 49
    with pytest.raises(SpecError, match="frames 50 is not of the form 8k"):
        continue_render(tasks[2]["params"]["spec"], 50, 2.0, "r", Fleet.of(_fleet(["2.5"])))
    headless = [{**w, "pack_components": {"p": ["transformer", "connector"]}} for w in _fleet(["2.5"])]
    with pytest.raises(SpecError, match="pack 'p' has no duration_head .* or give -f/--frames"):
        validate_spec(normalize_spec({"prompt": "a fox", "pack": "p"}), headless)
    old = normalize_spec({"prompt": "a fox", "pack": "p"})
    old = validate_spec(old, _fleet(["2.3"]))
    assert old.frames == 25


@pytest.mark.timeout(300)
def test_a_25_render_without_frames_takes_the_duration_heads_length(packs, tmp_path):
    """`farm render --local` without -f on the tiny 2.5 pack: the head's seconds become an 8k+1 length in
    the clamp, recorded in the render's metadata, and the clip has that many frames."""
    import av

    from farm_cli.local import render_local
    from ltx_engine.rules.duration import frames_for
    from worker.runner import Runner

    runner = Runner(packs)
    spec = {"prompt": "a fox", "height": 64, "width": 64, "pack": "tiny25", "frame_rate": 24.0, "decode_tiles": "off"}
    out, outputs, _ = render_local(dict(spec), tmp_path / "auto.mp4", runner)
    meta = json.loads(out.with_suffix(".json").read_text())
    frames, seconds = meta["spec"]["frames"], meta["spec"]["predicted_seconds"]
    assert frames == frames_for(seconds, 24.0) and 25 <= frames <= 481 and (frames - 1) % 8 == 0
    text, _ = runner.run("text_encode", {"pack": "tiny25", "prompt": "a fox"}, {})
    again, _ = runner.run("predict_duration", {"pack": "tiny25", "fps": 24.0}, text)
    assert int(again["frames"][0]) == frames and round(float(again["seconds"][0]), 4) == seconds
    with av.open(str(out)) as container:
        assert sum(1 for _ in container.decode(video=0)) == frames
    with pytest.raises(SpecError, match="pack 'bare25' has no duration_head .* or give -f/--frames"):
        render_local({**spec, "pack": "bare25"}, tmp_path / "no-head.mp4", runner)  # no duration_head file


@pytest.mark.timeout(300)
def test_tiled_stage_2_on_a_25_pack_carries_the_keyframe_marker(packs, tmp_path):
    """One tile without overlap equals the untiled stage 2 exactly on the 2.5 pack too: each tile forward
    reads its share of the first-frame keyframe marker (upstream's modality tiling slices it likewise)."""
    from coordinator.reduce.reducer import run_reduce_task
    from farm_cli.local import render_local
    from worker.runner import Runner

    runner = Runner(packs)
    spec = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "pack": "tiny25", "decode_tiles": "off",
            "audio": False, "stage2_sigmas": list(sampling.STAGE_2_DISTILLED_SIGMAS)}
    _, untiled, _ = render_local(dict(spec), tmp_path / "untiled.mp4", runner)
    _, tiled, blobs = render_local({**spec, "stage2_tiles": "1x1", "tile_overlap": 0}, tmp_path / "tiled.mp4", runner)
    assert tiled["local.stage2"]["video_latent"] == untiled["local.stage2"]["video_latent"]
    marker = blobs.get(tiled["local.stage2.cut"]["t0_keyframes"])
    assert marker.shape == (1, 2 * 4 * 4, 1) and marker[0, :16].all() and not marker[0, 16:].any()
    params = {"grid": [2, 4, 4], "counts": [1, 1, 1], "overlap": 0, "sigmas": [0.9, 0.0]}
    inputs = {k: blobs.get(tiled["local.stage2.prep"][k]) for k in ("latent", "mask", "positions")}
    assert "t0_keyframes" not in run_reduce_task("tdp_cut", params, inputs)  # a 2.3 render's tiles carry none
