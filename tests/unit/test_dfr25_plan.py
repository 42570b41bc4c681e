"""The planner's DFR base path (`dfr`, 0 rounds), spatial epilogue (`spatial_upscalings` 2), the decode's
keyframes and the stage-2 sampler record; the cost model and `farm plan` show the new tasks; bad DFR
input is one line and exit 2 through the real CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coordinator.plan import costs
from coordinator.plan.dfr_finish import final_keyframes
from coordinator.plan.graph import SpecError
from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from ltx_engine.rules.sampling import ANCESTRAL_STAGE2_NOISE_SEED_OFFSET, EULER, EULER_ANCESTRAL

FLEET = [
    {
        "packs": ["p"],
        "pack_features": {"p": ["keyframes"]},
        "pack_generation": {"p": "2.5"},
        "memory_bytes": 2**40,
    }
]


def _plan(**kw) -> tuple[dict, dict]:
    spec = validate_spec(normalize_spec({"prompt": "a fox", "frames": 41, "pack": "p", **kw}), FLEET)
    return spec, {t["id"]: t for t in plan_render(spec, "r")}


def test_base_path_at_0_rounds_has_the_canvas_slots_and_a_trim():
    spec, tasks = _plan(dfr=True, height=128, width=192, detailing_lora="d.safetensors")
    s1, s2 = tasks["r.stage1"]["params"], tasks["r.stage2"]["params"]
    assert s1["frames"] == s2["frames"] == 49 and s1["dfr_slots"] == s2["dfr_slots"] == [24, 48]
    assert tasks["r.stage2"]["inputs"]["slots"] == {"task": "r.upsample.slots", "output": "latent"}
    assert s2["detailing_lora"] == "d.safetensors" and "reference_latent" in tasks["r.stage2"]["inputs"]
    assert (s1["sampler"], s2["sampler"], s2["ancestral_offset"]) == (
        EULER_ANCESTRAL,
        EULER_ANCESTRAL,
        ANCESTRAL_STAGE2_NOISE_SEED_OFFSET,
    )
    trim = tasks["r.dfr.trim"]
    assert trim["capability"] == "coordinator" and trim["params"]["positions"] == [24, 48]
    assert trim["inputs"] == {
        "latent": {"task": "r.stage2", "output": "video_latent"},
        "keyframes": {"task": "r.stage2", "output": "slots"},
    }
    assert tasks["r.decode"]["inputs"]["latent"] == {"task": "r.dfr.trim", "output": "video_latent"}
    assert tasks["r.decode"]["params"]["expect"]["frames"]["shape"][0] == 41
    assert final_keyframes("r", spec) == ({"task": "r.dfr.trim", "output": "keyframes"}, (24,))
    assert not any(k.startswith("r.dfr.r") for k in tasks)


def test_the_epilogue_rebuilds_planes_and_tiles_its_steps():
    spec, tasks = _plan(spatial_upscalings=2, height=256, width=512)
    assert (tasks["r.stage1"]["params"]["height"], tasks["r.stage1"]["params"]["width"]) == (64, 128)
    assert (tasks["r.stage2"]["params"]["height"], tasks["r.stage2"]["params"]["width"]) == (128, 256)
    planes = [t for t in tasks.values() if t["kind"] == "dfr_keyframe_plane"]
    assert [(t["id"], t["params"]["plane"]) for t in planes] == [
        ("r.dfr.epi.kf0", 0),
        ("r.dfr.epi.kf1", 1),
        ("r.dfr.epi.open", 0),
    ]
    assert planes[2]["inputs"]["keyframes"] == {"task": "r.stage2", "output": "video_latent"}
    assert planes[0]["params"]["height"] == 256
    prep = tasks["r.dfr.epi.prep"]["params"]
    assert (
        prep["seed"] == spec.seed + 2000
        and prep["seed"] + prep["ancestral_offset"] == spec.seed + 30000
    )
    assert [(im["frame"], im["strength"], im["binding"]) for im in prep["images"]] == [
        (24, 1.0, "guide"),
        (48, 1.0, "guide"),
        (0, 1.0, "guide"),  # the opening frame, rebuilt
    ]
    forwards = [t for t in tasks.values() if t["kind"] == "transformer_forward"]
    assert len(forwards) == 4 + 16 + 16  # 2x2 at the first step, 4x4 after
    first = tasks["r.dfr.epi.s0"]["params"]
    assert first["counts"] == [1, 2, 2] and first["next_tiling"]["counts"] == [1, 4, 4]
    assert tasks["r.decode"]["params"]["expect"]["frames"]["shape"][1:3] == [256, 512]
    for kind in ("dfr_keyframe_plane", "dfr_trim"):
        task = next(t for t in tasks.values() if t["kind"] == kind)
        assert task["params"]["cost_s"] == pytest.approx(
            costs.reference_seconds(kind, task["params"]), abs=1e-4
        )
        assert task["params"]["cost_s"] > 0


def test_stage_2_stays_euler_below_ltx_2_5():
    fleet = [{"packs": ["p"], "pack_generation": {"p": "2.3"}, "memory_bytes": 2**40}]
    spec = validate_spec(normalize_spec({"prompt": "a fox", "frames": 25, "pack": "p"}), fleet)
    s2 = next(t for t in plan_render(spec, "r") if t["kind"] == "denoise_stage2")["params"]
    assert s2["sampler"] == EULER


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"spatial_upscalings": 2, "height": 192}, "height 192 is not a multiple of 128 .try 256."),
        ({"spatial_upscalings": 2, "images": [{"blob": "ab" * 32, "frame": 0}]}, "with --image is not built"),
        ({"dfr": True, "num_generated_keyframes": 1}, "--num-generated-keyframes does not apply to the dfr recipe"),
    ],
)
def test_the_planner_refuses_what_it_cannot_plan(changes, message):
    with pytest.raises(SpecError, match=message):
        _plan(**{"height": 256, "width": 256, **changes})


@pytest.mark.parametrize(
    "args",
    [
        ["--spatial-upscalings", "2", "-H", "192", "-W", "256"],
        ["--dfr", "--pipeline", "one-stage"],
        ["--spatial-upscalings", "5"],
    ],
)
def test_bad_dfr_input_is_one_line_and_exit_2_through_the_cli(args, tmp_path):
    from farm_cli.main import app

    result = CliRunner().invoke(
        app,
        ["render", "--local", "-p", "a fox", "-f", "41", "--pack", "tiny", *args],
        env={"FARM_DATA": str(tmp_path)},
    )
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("rounds", "want"),
    [
        ("0", ("36 transformer_forward",)),
        ("1", ("72 transformer_forward", "2 dfr_epi_window", "5 dfr_keyframe_plane")),
    ],
)
def test_farm_plan_shows_the_epilogue_tasks(rounds: str, want: tuple[str, ...], tmp_path: Path):
    (tmp_path / "fleet.toml").write_text(
        '[[workers]]\nname = "m1max"\nchip = "Apple M1 Max"\nmemory_gb = 64\n'
    )
    code = "from farm_cli.main import main; main()"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "plan",
            "-p",
            "fox",
            "--fleet",
            str(tmp_path / "fleet.toml"),
            "-H",
            "1024",
            "-W",
            "1536",
            "-f",
            "49",
            "--spatial-upscalings",
            "2",
            "--temporal-upscalings",
            rounds,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"FARM_DATA": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("DFR"))
    assert "1 dfr_trim" in row and all(w in row for w in want), row
    assert rounds == "1" or "3 dfr_keyframe_plane" in row


def test_a_keyframe_aware_decode_gets_the_planes_inside_the_clip_and_its_tile():
    import numpy as np

    from coordinator.plan.decode_keyframes import keyframe_decode_io
    from ltx_engine.rules.dfr_epilogue import task_keyframes

    spec, _ = _plan(dfr=True, height=128, width=192)
    params, inputs = keyframe_decode_io("r", spec)
    assert params == {"keyframe_frames": [24], "keyframe_planes": [0]}
    assert inputs == {"keyframes": {"task": "r.dfr.trim", "output": "keyframes"}}
    rounds = validate_spec(
        normalize_spec({"prompt": "a fox", "frames": 97, "pack": "p", "temporal_upscalings": 1}),
        [{**FLEET[0], "pack_features": {"p": ["keyframes", "temporal_upscaler"]}}],
    )
    params, inputs = keyframe_decode_io("r", rounds, frames=(0, 40))
    assert inputs["keyframes"]["task"] == "r.dfr.r1" and params["keyframe_frames"][:3] == [32, 64, 96]
    assert params["keyframe_planes"] == [0, 1]  # inside [0, 40] plus the nearest after
    planes = np.arange(len(params["keyframe_frames"]), dtype=np.float32).reshape(1, 1, -1, 1, 1)
    got, frames = task_keyframes(params, {"keyframes": planes})
    assert frames == (32, 64) and got.ravel().tolist() == [0.0, 1.0]
    assert keyframe_decode_io(
        "r", validate_spec(normalize_spec({"prompt": "a", "frames": 25, "pack": "p"}), FLEET)
    ) == (
        {},
        {},
    )


@pytest.mark.timeout(60)
def test_the_diffusion_decode_tasks_get_the_trimmed_clips_keyframes_each_tile_its_planes():
    """`--video-decoder diffusion` under DFR: every decode task names the plane at 24 and reads the trim's
    keyframes; the conv decoder's tasks get none (as upstream's conv path)."""
    kw = {"dfr": True, "height": 128, "width": 256, "decode_tiles": "48,192,192"}
    _, tasks = _plan(**kw, video_decoder="diffusion")
    tiles = [t for t in tasks.values() if t["kind"] == "decode_tile"]
    assert len(tiles) == 3
    for tile in tiles:
        assert (tile["params"]["keyframe_frames"], tile["params"]["keyframe_planes"]) == ([24], [0])
        assert tile["inputs"]["keyframes"] == {"task": "r.dfr.trim", "output": "keyframes"}
    _, conv = _plan(**{**kw, "decode_tiles": "off"})
    assert all("keyframes" not in t["inputs"] for t in conv.values() if t["kind"].startswith("decode_"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("kw", "audio_readers"),
    [
        ({"dfr": True}, {"r.stage1", "r.stage2"}),
        ({"temporal_upscalings": 1}, {"r.stage1", "r.stage2"}),  # the rounds run video only
        ({"spatial_upscalings": 2, "height": 256, "width": 256}, {"r.stage1", "r.stage2", "r.dfr.epi.prep"}),
    ],
)
def test_a2v_under_dfr_freezes_the_tracks_canvas_window_through_the_stages(kw, audio_readers):
    """`a2v --dfr`: the clip's window of the track encoded, its latent zero-padded to DFR's canvas (41 ->
    49 frames), frozen in stages 1-2 and the epilogue; no audio decode, nothing reads stage 1's audio."""
    fleet = [{**FLEET[0], "pack_features": {"p": ["keyframes", "temporal_upscaler"]}}]
    audio = {"blob": "ab" * 32, "start": 0.25, "name": "voice.wav"}
    spec = validate_spec(
        normalize_spec(
            {
                "prompt": "a fox",
                "frames": 41,
                "pack": "p",
                "height": 128,
                "width": 192,
                "audio_input": audio,
                **kw,
            }
        ),
        fleet,
    )
    tasks = {t["id"]: t for t in plan_render(spec, "r")}
    encode, s1, s2 = tasks["r.audio"], tasks["r.stage1"]["params"], tasks["r.stage2"]["params"]
    assert encode["kind"] == "audio_encode" and encode["params"]["start"] == 0.25
    assert (encode["params"]["frames"], s1["frames"]) == (41, 49)  # the clip's window, the canvas's stages
    assert encode["params"]["audio_frames"] == 43  # round(41 / 24 * 25)
    assert encode["params"]["pad_audio_frames"] == s1["audio_frames"] == s2["audio_frames"] == 51  # 49 frames
    assert encode["params"]["expect"]["latent"]["shape"][2] == 51
    assert s2["renoise_audio"] is False  # frozen in stage 2 as in stage 1 (the A2V rule)
    assert "decode_audio" not in {t["kind"] for t in tasks.values()}
    latent = {"task": "r.audio", "output": "latent"}
    readers = {i for i, t in tasks.items() if t["inputs"].get("audio_latent") == latent}
    assert readers == audio_readers
    assert all(
        r != {"task": "r.stage1", "output": "audio_latent"}
        for t in tasks.values()
        for r in t["inputs"].values()
    )
    assert not any("audio_latent" in t["inputs"] for t in tasks.values() if t["kind"] == "dfr_tile")
    assert list(tasks).index("r.audio") < list(tasks).index("r.stage1")  # --local runs in plan order


@pytest.mark.timeout(30)
def test_the_tracks_latent_is_right_padded_with_zero_tokens_to_the_canvas():
    import numpy as np

    from ltx_engine.rules.audio_source import fit_audio_tokens

    latent = np.arange(16 * 43 * 2, dtype=np.float32).reshape(1, 16, 43, 2) + 1
    padded = fit_audio_tokens(latent, 51)
    assert padded.shape == (1, 16, 51, 2) and np.array_equal(padded[:, :, :43], latent)
    assert not padded[:, :, 43:].any()  # zero tokens, the port's `fit_audio_tokens`
    assert fit_audio_tokens(latent, 40) is latent  # never cut
