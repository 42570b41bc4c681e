"""The HDR IC-LoRA render's graph (`coordinator/plan/hdr.py`): its tasks with and without the seam
keyframes, `farm plan --hdr-ic-lora` through the real CLI, and `--local`'s run of the graph (untiled encode)
against the engine's oracle (`ltx_engine.hdr_pipeline.hdr_ic_lora`): every latent, the decoded codes and the
EXR values bit for bit."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from coordinator.plan.resolved import Resolved
from tests.media_files import write_clip
from tests.session_fixtures import link_packs, pack_without

BLOB = "ab" * 32
SPEC = {
    "prompt": "a harbour",
    "height": 64,
    "width": 64,
    "frames": 25,
    "seed": 3,
    "pack": "tiny25",
    "audio": False,
    "hdr": True,
    "decode_tiles": "off",
    "hdr_ic_lora": {"blob": BLOB, "name": "clip.mp4"},
}


def _tasks(**changes) -> dict[str, dict]:
    plan = validate_spec(normalize_spec({**SPEC, **changes}).spec, [], Resolved(generation="2.5"))
    return {t["id"].removeprefix("r."): t for t in plan_render(plan, "r")}


@pytest.mark.timeout(30)
def test_the_graph_encodes_the_clip_guides_the_seam_and_runs_one_hdr_stage():
    tasks = _tasks(encode_tiles="24,96")
    assert [t["kind"] for t in tasks.values()] == [
        "text_encode",
        "video_encode",
        "video_encode",
        "video_encode_blend",
        "video_encode",
        "hdr_stage",
        "decode_video",
    ]
    stage = tasks["stage1"]
    assert stage["params"]["slots"] == [24] and stage["params"]["needs"] == ["transformer", "hdr_lora"]
    assert stage["inputs"]["reference_latent"] == {"task": "r.source_hdr", "output": "latent"}
    assert tasks["source_guide0"]["params"]["first"] == 24 and tasks["source_hdr.t0"]["params"]["hdr"] == {
        "transfer": "acescct",
        "input_colorspace": "srgb_gamma",
    }
    plain = _tasks(hdr_ic_lora={"blob": BLOB, "keyframes": False, "input_colorspace": "srgb"})
    assert "source_guide0" not in plain and plain["stage1"]["params"]["slots"] == []
    assert "slots" not in plain["stage1"]["params"]["expect"]
    assert plain["source_hdr.t0"]["params"]["hdr"]["input_colorspace"] == "srgb"


@pytest.mark.timeout(30)
def test_the_hdr_stage_carries_stage_1s_gang_table():
    """`--stage1-parallel K` on the grade: its one stage carries the degree table a gang is leased by (as a
    distilled stage 1 does); auto on a stage this small never gangs."""
    from coordinator.plan.sp_degree import REQUEST_PARAM, TABLE_PARAM

    params = _tasks(stage1_parallel="2")["stage1"]["params"]
    assert params[REQUEST_PARAM] == "2" and params[TABLE_PARAM] == [1, 2, 2, 2, 2, 2, 2, 2]
    assert _tasks()["stage1"]["params"][TABLE_PARAM] == [1]


@pytest.mark.timeout(30)
def test_the_diffusion_decoder_reads_the_seam_slots_as_its_keyframes():
    """As the oracle's `decode(latent, slots, seams)`: every diffusion decode task reads the stage's
    stacked seam slots and attends to the seam plane; without seams it decodes plain."""
    tiles = _tasks(video_decoder="diffusion", decode_tiles="48,192,192", width=256)
    decodes = [t for t in tiles.values() if t["kind"] == "decode_tile"]
    assert len(decodes) == 3 and [t["params"]["noise_seed"] for t in decodes] == [30003, 30004, 30005]
    for t in decodes:
        assert (t["params"]["keyframe_frames"], t["params"]["keyframe_planes"]) == ([24], [0])
        assert t["inputs"]["keyframes"] == {"task": "r.stage1", "output": "slots"}
        assert t["params"]["needs"] == ["vae_decoder_av"]
    plain = _tasks(video_decoder="diffusion", hdr_ic_lora={"blob": BLOB, "keyframes": False})["decode"]
    assert plain["params"]["decoder"] == "diffusion" and "keyframe_frames" not in plain["params"]
    assert set(plain["inputs"]) == {"latent"}
    conv = _tasks()["decode"]
    assert "decoder" not in conv["params"] and set(conv["inputs"]) == {"latent"}


@pytest.mark.timeout(30)
def test_generated_keyframes_are_refused_beside_the_seam_slots():
    from coordinator.plan.graph import SpecError

    with pytest.raises(SpecError, match=re.escape("its own keyframe slots at the clip's seams, and a stage takes one")):
        _tasks(num_generated_keyframes=1)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("changes", "flag"), [({"stage2_sigmas": [0.9, 0.0]}, "--stage2-sigmas"),
                                               ({"sparse_attention": [1.0]}, "--sparse-attention")])
def test_stage2_knobs_are_refused_on_the_grade_that_has_no_stage2(changes, flag):
    """The grade's one stage runs the distilled table with dense attention: a stage-2 knob would be dropped."""
    from coordinator.plan.graph import SpecError

    with pytest.raises(SpecError, match=f"^{re.escape(flag)} does not apply to the hdr-ic-lora recipe"):
        _tasks(**changes)


@pytest.mark.timeout(150)
def test_farm_plan_shows_the_hdr_graph_through_the_cli(tmp_path: Path):
    clip = write_clip(tmp_path / "clip.mp4", frames=9, width=64, height=64)
    (tmp_path / "fleet.toml").write_text(
        '[[workers]]\nname = "m4"\nchip = "Apple M4 Max"\nmemory_gb = 64\ngeneration = "2.5"\ncount = 2\n'
    )
    cmd = [
        sys.executable,
        "-c",
        "from farm_cli.main import main; main()",
        "plan",
        "-p",
        "a harbour",
        "--pack",
        "p25",
        "-H",
        "512",
        "-W",
        "768",
        "-f",
        "49",
        "--hdr-ic-lora",
        str(clip),
        "--fleet",
        str(tmp_path / "fleet.toml"),
    ]
    result = subprocess.run(
        [*cmd, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"FARM_DATA": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    stages = {row["stage"]: row["kinds"] for row in json.loads(result.stdout)["stages"]}
    assert list(stages)[:3] == ["text", "source", "stage1"] and stages["stage1"] == {"hdr_stage": 1}
    assert stages["source"]["video_encode"] >= 2 and "decode" in stages and "audio" not in stages


@pytest.fixture(scope="module")
def runner(tiny25_pack, tmp_path_factory):
    """A Runner over tiny25 and nolora25 (tiny25's files but its HDR LoRA)."""
    from ltx_engine.rules.hdr_lora import HDR_LORA_FILE
    from worker.runner import Runner

    packs = link_packs(tmp_path_factory.mktemp("hdr-plan-packs"), tiny25=tiny25_pack)
    pack_without(packs / "nolora25", tiny25_pack, HDR_LORA_FILE)
    return Runner(packs)


@pytest.mark.timeout(120)
def test_local_refuses_a_pack_without_the_lora_a_missing_length_and_a_short_clip(runner, tmp_path: Path):
    from coordinator.plan.graph import SpecError
    from farm_cli.local import render_local

    clip = write_clip(tmp_path / "clip.mp4", frames=25, width=64, height=64)
    sha = hashlib.sha256(clip.read_bytes()).hexdigest()
    base = {**SPEC, "hdr_ic_lora": {"blob": sha, "name": "clip.mp4"}}
    cases = [
        ({"pack": "nolora25"}, "pack 'nolora25' has no hdr_lora"),
        ({"frames": None}, "give -f N"),
        ({"frames": 33}, "--hdr-ic-lora clip.mp4: 25 frames, fewer than the render's 33 (-f)"),
    ]
    for changes, words in cases:
        with pytest.raises(SpecError, match=re.escape(words)):
            render_local({**base, **changes}, tmp_path / "x.mp4", runner, media={sha: clip})


@pytest.mark.timeout(300)
def test_local_runs_of_the_graph_equal_the_engine_oracle(runner, tmp_path: Path):
    from farm_cli.local import render_local
    from ltx_engine import hdr_pipeline
    from ltx_engine.hdr_sources import read_sdr_clip
    from ltx_engine.lora.lora import WithLoras
    from ltx_engine.rules import hdr_lora

    clip = write_clip(tmp_path / "clip.mp4", frames=25, width=64, height=64)
    sha = hashlib.sha256(clip.read_bytes()).hexdigest()
    spec = {
        **SPEC,
        "encode_tiles": "off",
        "exr": str(tmp_path / "exr"),
        "hdr_ic_lora": {"blob": sha, "name": "c"},
    }
    _, outputs, blobs = render_local(spec, tmp_path / "out.mp4", runner, media={sha: clip})
    engine, pack = runner.engine, runner.pack("tiny25")
    frames, fps = read_sdr_clip(clip)
    render = hdr_pipeline.HdrRender(fps, SPEC["seed"], blobs.get(outputs["local.text"]["video_context"]))
    fused = WithLoras(pack, ((str(pack.root / hdr_lora.HDR_LORA_FILE), hdr_lora.HDR_LORA_STRENGTH),))
    oracle = hdr_pipeline.hdr_ic_lora(
        engine, (pack, fused), frames, render, hdr_pipeline.conv_decode(engine, pack)
    )
    got = {
        "reference": ("source_hdr", "latent"),
        "video_latent": ("stage1", "video_latent"),
        "slots": ("stage1", "slots"),
        "codes": ("decode", "frames"),
    }
    for name, (task, output) in got.items():
        np.testing.assert_array_equal(blobs.get(outputs[f"local.{task}"][output]), oracle[name], err_msg=name)
    import OpenEXR

    with OpenEXR.File(str(tmp_path / "exr" / "frame_00024.exr"), separate_channels=True) as exr:
        values = np.stack([exr.channels()[c].pixels for c in "RGB"], axis=-1)
    np.testing.assert_array_equal(values, oracle["exr"][24].astype(np.float16))  # ACEScg, the default


@pytest.mark.timeout(300)
def test_local_diffusion_decode_of_the_grade_equals_the_oracle_with_its_seam_slots(runner, tmp_path: Path):
    """`--video-decoder diffusion`: `--local`'s graph decodes as the oracle with the keyframe-aware
    diffusion decoder handed the stage's slots at their seams (the MLX port's decode of the grade)."""
    from farm_cli.local import render_local
    from ltx_engine import hdr_pipeline
    from ltx_engine.hdr_sources import read_sdr_clip
    from ltx_engine.lora.lora import WithLoras
    from ltx_engine.rules import hdr_lora
    from ltx_engine.rules.diffusion_tiling import tile_noise_seed

    clip = write_clip(tmp_path / "clip.mp4", frames=25, width=64, height=64)
    sha = hashlib.sha256(clip.read_bytes()).hexdigest()
    spec = {**SPEC, "encode_tiles": "off", "video_decoder": "diffusion", "hdr_ic_lora": {"blob": sha, "name": "c"}}
    _, outputs, blobs = render_local(spec, tmp_path / "out.mp4", runner, media={sha: clip})
    engine, pack = runner.engine, runner.pack("tiny25")
    frames, fps = read_sdr_clip(clip)
    render = hdr_pipeline.HdrRender(fps, SPEC["seed"], blobs.get(outputs["local.text"]["video_context"]))
    fused = WithLoras(pack, ((str(pack.root / hdr_lora.HDR_LORA_FILE), hdr_lora.HDR_LORA_STRENGTH),))
    seed = tile_noise_seed(SPEC["seed"], 0)

    def keyframe_decode(latent, slots, seams):
        pixels = engine.decode_video_diffusion(pack, latent, seed, keyframes=(slots, seams))
        return np.clip((pixels[0] + 1.0) / 2.0, 0.0, 1.0).transpose(1, 2, 3, 0)

    oracle = hdr_pipeline.hdr_ic_lora(engine, (pack, fused), frames, render, keyframe_decode)
    assert oracle["slots"].shape[2] == 1  # the seam at frame 24
    np.testing.assert_array_equal(blobs.get(outputs["local.stage1"]["slots"]), oracle["slots"])
    np.testing.assert_array_equal(blobs.get(outputs["local.decode"]["frames"]), oracle["codes"])
    plain = hdr_pipeline.conv_decode(engine, pack)(oracle["video_latent"], None, ())
    assert not np.array_equal(plain, oracle["codes"])  # the diffusion decoder ran, not the conv VAE


@pytest.mark.timeout(240)
def test_render_local_refuses_an_hdr_lora_with_the_wrong_metadata_in_one_line(runner, tmp_path: Path):
    """The pack's HDR LoRA file is there but is another LoRA: the worker's check (the farm fails the task
    with it) reaches `farm render --local` as one line, exit 2, not a traceback."""
    import mlx.core as mx

    from ltx_engine.rules.hdr_lora import HDR_LORA_FILE

    packs = tmp_path / "packs"
    (packs / "wrong25").mkdir(parents=True)
    for f in (runner.packs_dir / "tiny25").iterdir():
        if f.name != HDR_LORA_FILE:
            (packs / "wrong25" / f.name).symlink_to(f)
    mx.save_safetensors(
        str(packs / "wrong25" / HDR_LORA_FILE),
        {"x": mx.zeros((1,))},
        metadata={"reference_downscale_factor": "2"},
    )
    clip = write_clip(tmp_path / "clip.mp4", frames=25, width=64, height=64)
    args = ["render", "--local", "-p", "a harbour", "--pack", "wrong25", "-H", "64", "-W", "64", "-f", "25"]
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from farm_cli.main import main; main()",
            *args,
            "--hdr-ic-lora",
            str(clip),
            "--no-keyframes",
            "-o",
            str(tmp_path / "out.mp4"),
        ],
        capture_output=True,
        text=True,
        timeout=220,
        env={"FARM_DATA": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    refusal = [line for line in result.stderr.splitlines() if line.startswith("farm: ")]  # the rest: progress
    assert result.returncode == 2 and len(refusal) == 1 and "Traceback" not in result.stderr, result.stderr[
        -3000:
    ]
    assert "not an HDR IC-LoRA" in refusal[0] and result.stderr.rstrip().endswith(refusal[0]), refusal
