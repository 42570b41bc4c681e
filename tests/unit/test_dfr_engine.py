"""DFR temporal tiles: the tile's token layout, the 2.5 noiser, image guides per tile, the stitch and carry,
the planner's graph (padded canvas, slots from stage 1 to the rounds) and refusals, and a real tile on
the tiny LTX-2.5 pack (no fakes)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from coordinator.plan.graph import SpecError
from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from coordinator.reduce.reducer import run_reduce_task
from ltx_engine.dfr import build_tile_state, noised_tile_state, tile_image_frame
from ltx_engine.models import patchify
from ltx_engine.rules.dfr_layout import plan_dfr, plan_params
from ltx_engine.rules.sampling import lerp_noise
from ltx_engine.rules.tokens import patchify_video
from tests.session_fixtures import link_packs

C, H, W = 128, 2, 3


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("frame", [0, 12, 40])
def test_keyframe_positions_span_one_pixel_frame(frame):
    pos = np.array(patchify.keyframe_positions(1, frame, H, W, 60.0))
    video = np.array(patchify.video_positions(1, 1, H, W, 60.0))
    np.testing.assert_array_equal(pos[:, 1:], video[:, 1:])  # the same spatial cells as a latent frame
    np.testing.assert_allclose(pos[0, 0, :, 0], frame / 60.0, rtol=1e-7)
    np.testing.assert_allclose(pos[0, 0, :, 1], (frame + 1) / 60.0, rtol=1e-7)
    wide = np.array(patchify.keyframe_positions(1, frame, H, W, 60.0, num_pixel_frames=8))
    assert np.allclose(wide[0, 0, :, 1], (frame + (1 if frame == 0 else 8)) / 60.0)


def test_lerp_noise_keeps_each_tokens_own_start():
    n, s = _rand((1, 3, 4), 1), 0.975
    video, seed, anchor = _rand((1, 3, 4), 2), _rand((1, 3, 4), 3), _rand((1, 3, 4), 4)
    ones = np.ones((1, 3, 1), np.float32)
    np.testing.assert_allclose(lerp_noise(video, video, n, s, ones), (1 - s) * video + s * n, atol=1e-6)
    np.testing.assert_allclose(lerp_noise(seed, 0 * seed, n, s, ones), (1 - s) * seed + s * n, atol=1e-6)
    got = lerp_noise(0 * anchor, anchor, n, s, 0.05 * ones)
    np.testing.assert_allclose(got, anchor + 0.05 * (s * n - anchor), atol=1e-6)


def _round(frames=97, rounds=1):
    plan = plan_dfr(frames, 24.0, rounds, seed=7)
    return plan, plan.rounds[-1]


def test_tile_tokens_pinned_prefix_generated_then_anchors_then_slots():
    plan, rnd = _round()
    tile = rnd.tiles[1]  # window [96, 192]: prefix 96..128 (5 cells), anchor 192 (local 96), slot 160 (local 64)
    latent = _rand((1, C, rnd.latent_frames, H, W), 5)
    carry = _rand((1, C, len(rnd.seams), H, W), 6)
    prefix = _rand((1, C, tile.pinned, H, W), 7)
    with pytest.raises(ValueError, match="give its prefix"):
        build_tile_state(latent, tile, rnd, carry, rnd.seams)
    tokens, grid = build_tile_state(latent, tile, rnd, carry, rnd.seams, prefix=prefix)
    init, clean, mask, positions, marked = tokens.joined()
    per, n_gen, pin = H * W, tile.latent_frames * H * W, tile.pinned * H * W
    assert grid == (tile.latent_frames, H, W) and init.shape[1] == n_gen + 2 * per and tile.pinned == 5
    np.testing.assert_array_equal(init[:, :pin], patchify_video(prefix))  # pinned at strength 1
    np.testing.assert_array_equal(clean[:, :pin], patchify_video(prefix))
    assert not mask[:, :pin].any() and (mask[:, pin:n_gen] == 1).all()
    np.testing.assert_array_equal(init[:, pin:n_gen], patchify_video(latent[:, :, 17:25]))
    assert marked[0, :per].all() and not marked[0, per : n_gen + per].any() and marked[0, -per:].all()
    sl = slice(n_gen, n_gen + per)  # the anchor at 192
    np.testing.assert_array_equal(clean[:, sl], patchify_video(carry[:, :, rnd.seams.index(192)][:, :, None]))
    assert not init[:, sl].any() and np.allclose(mask[:, sl], 0.05) and tile.local_anchors == (96,)
    np.testing.assert_allclose(positions[0, 0, sl.start, :], [96 / 60.0, 97 / 60.0])
    sl = slice(n_gen + per, n_gen + 2 * per)  # the slot at 160: seeded from latent frame 20 (window frame 8)
    np.testing.assert_array_equal(init[:, sl], patchify_video(latent[:, :, 20][:, :, None]))
    assert not clean[:, sl].any() and (mask[:, sl] == 1).all() and tile.local_slots == (64,)
    assert rnd.conditioning_fps == 60.0  # 48 fps playback snaps to 60 for RoPE, as the reference


def test_tile_state_is_keyed_by_the_tile_seed_and_refuses_a_missing_anchor():
    _, rnd = _round()
    latent, carry = _rand((1, C, rnd.latent_frames, H, W), 1), _rand((1, C, 3, H, W), 2)
    a = noised_tile_state(latent, rnd.tiles[0], rnd, carry, rnd.seams)
    b = noised_tile_state(latent, rnd.tiles[0], rnd, carry, rnd.seams)
    np.testing.assert_array_equal(a.state.latent, b.state.latent)
    assert a.slot_start == a.state.num_tokens - 2 * H * W and a.num_slots == 2
    with pytest.raises(ValueError, match="not among the carried"):
        noised_tile_state(latent, rnd.tiles[0], rnd, carry, (1, 2, 3))


def test_an_image_conditions_the_tiles_whose_denoised_frames_hold_it():
    _, rnd = _round()  # round 1 of 97 frames: windows [0, 128] and [96, 192] (pinned 96..128)
    first, second = rnd.tiles
    assert tile_image_frame(first, 0) == 0 and tile_image_frame(first, 150) == 150  # the first tile keeps all
    assert tile_image_frame(second, 0) is None and tile_image_frame(second, 150) == 54
    assert tile_image_frame(second, 112) is None and tile_image_frame(second, 129) == 33  # the prefix is pinned
    latent = _rand((1, C, rnd.latent_frames, H, W), 5)
    carry = _rand((1, C, len(rnd.seams), H, W), 6)
    image = _rand((1, C, 1, H, W), 7)
    per = H * W
    tokens, _ = build_tile_state(latent, first, rnd, carry, rnd.seams, (image, 0, 0.8))
    init, clean, mask, _, marked = tokens.joined()
    plain, _ = build_tile_state(latent, first, rnd, carry, rnd.seams)
    assert init.shape == plain.joined()[0].shape  # frame 0 replaces the window's first latent frame
    np.testing.assert_array_equal(init[:, :per], patchify_video(image))
    np.testing.assert_array_equal(clean[:, :per], patchify_video(image))
    np.testing.assert_allclose(mask[:, :per], 0.2, rtol=1e-6)
    prefix = _rand((1, C, second.pinned, H, W), 8)
    tokens, _ = build_tile_state(latent, second, rnd, carry, rnd.seams, (image, 150, 0.8), prefix=prefix)
    init, clean, mask, positions, marked = tokens.joined()
    n_gen = second.latent_frames * per
    guide = slice(n_gen, n_gen + per)  # an unmarked guide right after the window, before the anchors
    plain, _ = build_tile_state(latent, second, rnd, carry, rnd.seams, prefix=prefix)
    assert init.shape[1] == plain.joined()[0].shape[1] + per and not init[:, guide].any()
    np.testing.assert_array_equal(clean[:, guide], patchify_video(image))
    assert not marked[:, guide].any() and np.allclose(mask[:, guide], 0.2)
    np.testing.assert_allclose(positions[0, 0, n_gen, :], [54 / 60.0, 55 / 60.0])


def test_stitch_carries_anchors_and_each_tiles_own_slots():
    params = plan_params(97, 24.0, 2, 3)
    plan = plan_dfr(97, 24.0, 2, 3)
    carry = _rand((1, C, 3, H, W), 1)  # stage 2's slots at 32, 64, 96: round 1's anchors at 64, 128, 192
    rnd = plan.rounds[0]
    inputs = {"carry": carry}
    for t in rnd.tiles:
        inputs[f"t{t.index}_latent"] = np.full((1, C, t.latent_frames, H, W), t.index, np.float32)
        inputs[f"t{t.index}_slots"] = np.stack([np.full((1, C, H, W), 10 * t.index + k, np.float32)
                                                for k in range(len(t.slots))], axis=2)
    out = run_reduce_task("dfr_stitch", {"dfr": params, "round": 1}, inputs)
    assert out["latent"].shape[2] == rnd.latent_frames and "video_latent" not in out
    assert rnd.carry() == (32, 64, 96, 128, 160, 192)
    kf = out["keyframes"][0, 0, :, 0, 0]
    np.testing.assert_array_equal(kf[[1, 3, 5]], carry[0, 0, :, 0, 0])  # anchors 64 128 192
    assert list(kf[[0, 2, 4]]) == [0.0, 1.0, 10.0]  # slots 32, 96 from tile 0, 160 from tile 1 (each made once)


def _fleet(features: list[str]) -> list[dict]:
    return [{"packs": ["p"], "pack_features": {"p": features}, "memory_bytes": 2**40}]


def _dfr_spec(**kw) -> dict:
    return normalize_spec({"prompt": "a fox", "frames": 49, "pack": "p", "temporal_upscalings": 2, **kw})


def test_planner_pads_the_canvas_and_carries_slots_from_stage_1_to_the_rounds():
    spec = _dfr_spec(frames=41, image={"blob": "ab" * 32, "frame": 0, "strength": 0.9})  # 41 -> canvas 49, S 24
    spec = validate_spec(spec, _fleet(["temporal_upscaler", "keyframes"]))
    assert (spec.output_frames, spec.output_fps) == ((41 - 1) * 4 + 1, 96.0)
    tasks = {t["id"]: t for t in plan_render(spec, "r")}
    s1, s2 = tasks["r.stage1"]["params"], tasks["r.stage2"]["params"]
    assert s1["frames"] == s2["frames"] == 49 and s1["dfr_slots"] == s2["dfr_slots"] == [24, 48]
    assert s1["audio_frames"] == round(49 / 24 * 25) and s2["renoise_audio"] is True
    assert s1["expect"]["slots"]["shape"] == [1, -1, 2, 4, 6] and s2["expect"]["slots"]["shape"] == [1, -1, 2, 8, 12]
    assert tasks["r.upsample.slots"]["inputs"]["latent"] == {"task": "r.stage1", "output": "slots"}
    assert tasks["r.stage2"]["inputs"]["slots"] == {"task": "r.upsample.slots", "output": "latent"}
    tile = tasks["r.dfr.r1.t0"]
    assert tile["inputs"]["carry"] == {"task": "r.stage2", "output": "slots"} and "audio_latent" not in tile["inputs"]
    assert tile["inputs"]["image1_latent"] == {"task": "r.image1_s2", "output": "latent"}
    assert tile["params"]["images"] == [{"frame": 0, "strength": 0.9, "binding": "replace", "input": "image1_latent"}]
    assert tasks["r.dfr.r2.t0"]["inputs"]["carry"] == {"task": "r.dfr.r1", "output": "keyframes"}
    assert tasks["r.decode"]["params"]["expect"]["frames"]["shape"][0] == 161


def test_planner_graph_output_and_chained_tiles():
    spec = _dfr_spec()
    spec = validate_spec(spec, _fleet(["temporal_upscaler", "keyframes"]))
    assert (spec.output_frames, spec.output_fps) == ((49 - 1) * 4 + 1, 96.0)
    tasks = {t["id"]: t for t in plan_render(spec, "r")}
    assert tasks["r.decode"]["params"]["expect"]["frames"]["shape"][0] == 193
    assert tasks["r.decode"]["inputs"]["latent"] == {"task": "r.dfr.r2", "output": "video_latent"}
    tiles = {t["id"]: t for t in tasks.values() if t["kind"] == "dfr_tile"}
    assert sorted(tiles) == [f"r.dfr.r1.t{i}" for i in range(2)] + [f"r.dfr.r2.t{i}" for i in range(4)]
    for tile in tiles.values():  # a tile reads its round's upsample, and (TilePrefix) the tile before it alone
        r, index = tile["id"].split(".")[2], tile["params"]["tile_index"]
        assert f"r.dfr.{r}.up" in tile["deps"]
        before = {f"r.dfr.{r}.t{index - 1}"} if index else set()
        assert set(tile["deps"]) & set(tiles) == before
        if index:
            assert tile["inputs"]["previous"] == {"task": f"r.dfr.{r}.t{index - 1}", "output": "latent"}
            assert tile["inputs"]["previous_slots"] == {"task": f"r.dfr.{r}.t{index - 1}", "output": "slots"}
    assert tasks["r.dfr.r2"]["capability"] == "coordinator" and tasks["r.dfr.r2.up"]["capability"] == "mlx"
    assert tasks["r.audio"]["inputs"]["latent"] == {"task": "r.stage1", "output": "audio_latent"}


@pytest.mark.parametrize(("changes", "fleet", "match"), [
    ({"frames": 1}, [], "must be >= 2 for a DFR canvas"),
    ({"temporal_upscalings": 3}, [], "must be 0, 1 or 2"),
    ({}, _fleet(["keyframes"]), "no temporal upsampler"),
    ({}, _fleet(["temporal_upscaler"]), "not an LTX-2.5 pack"),
    ({"frames": 473, "frame_rate": 24.0}, [], "exceeds the model's 20 s range"),
])
def test_bad_dfr_specs_are_refused_in_one_line(changes, fleet, match):
    with pytest.raises(SpecError, match=match) as info:
        validate_spec(_dfr_spec(**changes), fleet)
    assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def runner_2325(tiny25_pack, tiny_packs, tmp_path_factory):
    """A Runner over the session's tiny packs, the 2.3 one named `tiny23`."""
    from worker.runner import Runner

    return Runner(link_packs(tmp_path_factory.mktemp("packs25"), tiny25=tiny25_pack, tiny23=tiny_packs / "tiny"))


def _tile_task(runner, pack: str, tile_index: int = 1):
    text, _ = runner.run("text_encode", {"pack": pack, "prompt": "a fox"}, {})
    _, rnd = _round(49)
    inputs = {**text, "latent": _rand((1, C, rnd.latent_frames, 4, 6), 1),
              "carry": _rand((1, C, len(rnd.seams), 4, 6), 2)}
    if tile_index:  # the tile before it (7 cells, its slot at 24): the prefix's source
        inputs |= {"previous": _rand((1, C, 7, 4, 6), 3), "previous_slots": _rand((1, C, 1, 4, 6), 4)}
    params = {"pack": pack, "dfr": plan_params(49, 24.0, 1, 7), "round": 1, "tile_index": tile_index}
    return params, inputs


def test_a_real_tile_is_deterministic_and_reads_the_keyframe_marker(runner_2325):
    params, inputs = _tile_task(runner_2325, "tiny25")
    out, _ = runner_2325.run("dfr_tile", params, inputs)
    again, _ = runner_2325.run("dfr_tile", params, inputs)
    assert out["latent"].shape == (1, C, 10, 4, 6) and out["slots"].shape == (1, C, 1, 4, 6)  # window [24, 96]
    pinned = np.concatenate([inputs["previous_slots"], inputs["previous"][:, :, 4:7]], axis=2)
    np.testing.assert_array_equal(out["latent"][:, :, :4], pinned)  # the plane at 24, tile 0's cells 4..6
    for name in out:
        np.testing.assert_array_equal(out[name], again[name])
    model = runner_2325.engine.model(runner_2325.pack("tiny25"), "transformer")
    saved = model.keyframes_abs_pos_embedding
    model.keyframes_abs_pos_embedding = mx.zeros_like(saved)
    try:
        unmarked, _ = runner_2325.run("dfr_tile", params, inputs)
    finally:
        model.keyframes_abs_pos_embedding = saved
    assert not np.array_equal(unmarked["latent"], out["latent"])
    other, _ = runner_2325.run("dfr_tile", {**params, "tile_index": 0}, inputs)
    assert other["latent"].shape[2] == 7


def test_a_23_pack_refuses_tiles_and_reports_no_dfr_features(runner_2325):
    params, inputs = _tile_task(runner_2325, "tiny23")
    with pytest.raises(ValueError, match="not an LTX-2.5 pack"):
        runner_2325.run("dfr_tile", params, inputs)
    features = runner_2325.capabilities()["pack_features"]
    assert set(features["tiny25"]) == {"temporal_upscaler", "keyframes"}
    assert features["tiny23"] == ["temporal_upscaler"]


def test_upsample_temporal_doubles_frames(runner_2325):
    out, _ = runner_2325.run("upsample_temporal", {"pack": "tiny25"}, {"latent": _rand((1, C, 7, 8, 12), 9)})
    assert out["latent"].shape == (1, C, 13, 8, 12) and out["latent"].dtype == np.float32


def test_keyframe_mask_is_a_no_op_without_the_embedding(runner_2325):
    from ltx_engine.models.transformer import Modality

    model = runner_2325.engine.model(runner_2325.pack("tiny23"), "transformer")
    n = 2 * H * W
    base = dict(latent=mx.array(_rand((1, n, C), 1)), sigma=mx.array([0.5]), timesteps=mx.full((1, n), 0.5),
                positions=patchify.video_positions(1, 2, H, W, 24.0), context=mx.array(_rand((1, 4, 64), 2)))
    plain, _ = model(Modality(**base), None)
    marked, _ = model(Modality(**base, keyframes_mask=mx.ones((1, n, 1))), None)
    np.testing.assert_array_equal(np.array(plain), np.array(marked))


def test_pack_tiny_cli_writes_the_25_variant(tmp_path: Path):
    from typer.testing import CliRunner

    from farm_cli.main import app

    result = CliRunner().invoke(app, ["pack", "tiny", str(tmp_path / "p"), "--variant", "2.5"])
    assert result.exit_code == 0, result.output
    import json

    cfg = json.loads((tmp_path / "p" / "embedded_config.json").read_text())["transformer"]
    assert cfg["use_keyframes_abs_pos_embedding"] and cfg["ff_bias"] is False
    bad = CliRunner().invoke(app, ["pack", "tiny", str(tmp_path / "q"), "--variant", "3.0"])
    assert bad.exit_code != 0 and "--variant" in bad.output


def test_tiled_dfr_stage_2_marks_and_reads_out_the_slots():
    spec = _dfr_spec(frames=41, stage2_tiles="2x2", tile_overlap=1, detailing_lora="detail.safetensors",
                     image={"blob": "ab" * 32, "frame": 16, "strength": 0.9})
    spec = validate_spec(spec, [{**_fleet(["temporal_upscaler", "keyframes"])[0], "pack_generation": {"p": "2.5"}}])
    tasks = {t["id"]: t for t in plan_render(spec, "r")}
    final = tasks["r.stage2"]  # the last blend + step: 8x12 latent cells, 7 frames, a guide before the slots
    assert final["kind"] == "tdp_step" and final["params"]["grid"] == [7, 8, 12]
    assert final["params"]["slot_range"] == [7 * 96 + 96, 7 * 96 + 96 + 2 * 96] and final["params"]["marker"]
    tile = tasks["r.stage2.s0.t0"]
    assert tile["params"]["detailing_lora"] == "detail.safetensors" and "keyframes" in tile["inputs"]
    assert tasks["r.stage2.prep"]["params"]["renoise_audio"] is False  # tiled: stage 1's audio frozen, as TDP's
    assert tasks["r.dfr.r1.t0"]["inputs"]["carry"] == {"task": "r.stage2", "output": "slots"}


def test_detailing_lora_conditions_stage_2_on_stage_1s_video():
    spec = _dfr_spec(detailing_lora="detail.safetensors")
    spec = validate_spec(spec, _fleet(["temporal_upscaler", "keyframes"]))
    tasks = {t["id"]: t for t in plan_render(spec, "r")}
    s2 = tasks["r.stage2"]
    assert (s2["params"]["detailing_lora"], s2["params"]["detailing_strength"]) == ("detail.safetensors", 0.5)
    assert s2["inputs"]["reference_latent"] == {"task": "r.stage1", "output": "video_latent"}
    assert "detailing_lora" not in tasks["r.dfr.r1.t0"]["params"]  # detached for the rounds
    for bad, match in [({"temporal_upscalings": 0}, "--detailing-lora does not apply to the distilled recipe"),
                       ({"detailing_lora": "../x.safetensors"}, "not a .safetensors file name"),
                       ({"detailing_strength": 3}, "outside")]:
        with pytest.raises(SpecError, match=match):
            validate_spec(_dfr_spec(**{"detailing_lora": "detail.safetensors", **bad}), [])


@pytest.mark.timeout(300)
def test_a_detailing_lora_is_fused_once_into_a_dit_of_its_own(runner_2325, tmp_path):
    """Stage 2 with the tiny pack's detailing IC-LoRA (bf16 here; q8/q4 fusion has its parity
    test): differs from plain stage 2, repeats bit for bit without building the fused DiT again, and
    leaves the plain DiT (the rounds') as it was."""
    from ltx_engine.tiny.tiny_pack import DETAILING_LORA

    text, _ = runner_2325.run("text_encode", {"pack": "tiny25", "prompt": "a fox"}, {})
    params = {"pack": "tiny25", "seed": 3, "frames": 49, "fps": 24.0, "height": 64, "width": 64, "audio_frames": 51,
              "sigmas": [0.909375, 0.725, 0.421875, 0.0], "noise_stream": 1, "dfr_slots": [24, 48], "renoise_audio": True}
    inputs = {**text, "latent": _rand((1, C, 7, 2, 2), 1), "audio_latent": _rand((1, 8, 51, 16), 2),
              "slots": _rand((1, C, 2, 2, 2), 3), "reference_latent": _rand((1, C, 7, 1, 1), 4)}
    plain, _ = runner_2325.run("denoise_stage2", params, inputs)
    detailed, _ = runner_2325.run("denoise_stage2", {**params, "detailing_lora": DETAILING_LORA,
                                                  "detailing_strength": 0.5}, inputs)
    loaded = runner_2325.engine.registry.load_seconds
    again, _ = runner_2325.run("denoise_stage2", {**params, "detailing_lora": DETAILING_LORA,
                                               "detailing_strength": 0.5}, inputs)
    assert runner_2325.engine.registry.load_seconds == loaded  # the fused DiT stayed warm
    assert not np.array_equal(plain["video_latent"], detailed["video_latent"])
    for name in detailed:
        np.testing.assert_array_equal(detailed[name], again[name])
    unchanged, _ = runner_2325.run("denoise_stage2", params, inputs)
    np.testing.assert_array_equal(unchanged["video_latent"], plain["video_latent"])
    with pytest.raises(Exception, match="has no detailing LoRA file 'missing.safetensors'"):
        runner_2325.run("denoise_stage2", {**params, "detailing_lora": "missing.safetensors",
                                        "detailing_strength": 0.5}, inputs)


def test_the_cli_passes_the_detailing_lora_to_the_planner(runner_2325):
    from typer.testing import CliRunner

    from farm_cli.main import app

    pack = str(runner_2325.packs_dir / "tiny25")
    result = CliRunner().invoke(app, ["render", "--local", "-p", "a fox", "-H", "64", "-W", "64", "-f", "9", "--pack",
                                      pack, "--detailing-lora", "x.safetensors", "--detailing-strength", "0.7"])
    assert result.exit_code == 2 and "--detailing-lora does not apply to the distilled recipe (--pipeline distilled); it applies to: dfr," in result.output


class _GatedHub(BaseHTTPRequestHandler):
    """The hub's auth-check answer for a gated repo whose licence this user has not accepted."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        gated = self.path.startswith("/api/models/Lightricks/gated-lora/auth-check")
        self.send_response(403 if gated else 404)
        self.send_header("X-Error-Code", "GatedRepo" if gated else "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        body = json.dumps({"error": "gated" if gated else "not found"}).encode()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_a_gated_lora_repo_is_refused_before_anything_queues(runner_2325, monkeypatch):
    """--detailing-lora REPO against a real HTTP hub endpoint (HF_ENDPOINT) that says the repo is gated:
    one line naming the licence page, exit 2, before the pack is even opened."""
    from typer.testing import CliRunner

    from farm_cli.main import app

    server = ThreadingHTTPServer(("127.0.0.1", 0), _GatedHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    try:
        args = ["render", "--local", "-p", "a fox", "-H", "64", "-W", "64", "-f", "9", "--temporal-upscalings", "1",
                "--pack", "no-such-pack"]
        result = CliRunner().invoke(app, [*args, "--detailing-lora", "Lightricks/gated-lora"])
        assert result.exit_code == 2 and f"is gated: accept its licence at {endpoint}/Lightricks/gated-lora" in result.output
        assert len(result.output.strip().splitlines()) == 1
        missing = CliRunner().invoke(app, [*args, "--detailing-lora", "Lightricks/nothing-here"])
        assert missing.exit_code == 2 and "not found on the hub" in missing.output
    finally:
        server.shutdown()
