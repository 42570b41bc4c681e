"""`--video-decoder diffusion` in the planner: its tiles, task params, needs, costs, refusals."""

from __future__ import annotations

import pytest

from coordinator.plan import costs
from coordinator.plan.decode import decode_tile_plan, plan_decode, resolve_decode_tiles
from coordinator.plan.diffusion_decode import check_video_decoder
from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import SpecError
from coordinator.plan.resolved import RenderPlan
from ltx_engine.models.diffusion_decoder import DiffusionDecoderConfig
from ltx_engine.rules.decode_tiling import temporal_pixel_span
from ltx_engine.rules.diffusion_tiling import DiffusionTileSizes, min_latent_shape, parse_sizes, tile_plan

_stored = RenderPlan.from_stored  # the test specs as the render hash would hold them
SPEC = {
    "pack": "p",
    "seed": 5,
    "height": 64,
    "width": 256,
    "frames": 9,
    "video_decoder": "diffusion",
    "decode_tiles": "48,192,192",
    "generation": "2.5",
}


def test_tiles_use_the_40_frame_160_px_overlaps_and_the_conv_pixel_mapping():
    tiles = tile_plan((13, 20, 20), DiffusionTileSizes(96, 512, 512))
    latent_f = sorted({(t.latent[0].start, t.latent[0].end) for t in tiles})
    assert latent_f == [(0, 12), (6, 13)]  # 12-latent tiles, 5 overlap, the causal one-latent-earlier start
    latent_w = sorted({(t.latent[2].start, t.latent[2].end) for t in tiles})
    assert latent_w == [(0, 16), (11, 20)]
    second = next(t for t in tiles if t.latent[0].start == 6)
    assert second.pixel[0] == temporal_pixel_span(second.latent[0])[:2]


def test_size_floor_is_upstreams_rule_for_the_production_decoder():
    cfg = DiffusionDecoderConfig()
    assert min_latent_shape(cfg.stage_kernels, cfg.strides, cfg.stage5_kernel) == (3, 7, 7)
    assert cfg.ghost_latents == 2


def test_decode_tasks_carry_the_decoder_a_seed_per_tile_and_need_vae_decoder_av():
    tasks = plan_decode("r", _stored(SPEC), {"task": "r.stage2", "output": "latent"})
    assert [t["params"]["noise_seed"] for t in tasks] == [30005, 30006, 30007]
    assert {tuple(t["params"]["needs"]) for t in tasks} == {("vae_decoder_av",)}
    whole = plan_decode("r", _stored({**SPEC, "decode_tiles": "off"}), {"task": "r.stage2", "output": "latent"})
    assert [t["kind"] for t in whole] == ["decode_video"] and whole[0]["params"]["noise_seed"] == 30005
    conv = plan_decode("r", _stored({**SPEC, "video_decoder": None}), {"task": "r.stage2", "output": "latent"})
    assert "decoder" not in conv[0]["params"] and conv[0]["params"]["needs"] == ["vae_decoder"]


def test_auto_tiles_only_across_workers_and_bad_sizes_are_one_line():
    spec = _stored({**SPEC, "decode_tiles": "auto"})
    assert resolve_decode_tiles(spec, Fleet.of([{"packs": ["p"]}])) == "off"
    assert resolve_decode_tiles(spec, Fleet.of([{"packs": ["p"]}] * 2)) == "96,512,512"
    small_mac = Fleet.of([{"packs": ["p"], "memory_bytes": 16 * 2**30}])
    big = _stored({**SPEC, "decode_tiles": "auto", "height": 1024, "width": 1536, "frames": 121})  # ~95 GB whole: tiled even on one Mac
    assert (
        resolve_decode_tiles(big, small_mac) == "96,512,512"
        and resolve_decode_tiles(spec, small_mac) == "off"
    )
    assert decode_tile_plan(_stored({**SPEC, "decode_tiles": "off"})) is None
    with pytest.raises(SpecError, match="height tile 128 is no larger than its overlap 160"):
        resolve_decode_tiles(_stored({**SPEC, "decode_tiles": "48,128,192"}), Fleet())
    with pytest.raises(ValueError, match="not a multiple of 8"):
        parse_sizes("44,192,192")


def test_refused_on_23_and_without_the_file():
    with pytest.raises(SpecError, match="needs an LTX-2.5 pack"):
        check_video_decoder(_stored({**SPEC, "generation": "2.3"}))
    with pytest.raises(SpecError, match="hf download dgrauet/ltx-2.5-mlx-q8 vae_decoder_av.safetensors"):
        check_video_decoder(_stored(SPEC), has_component=False)
    check_video_decoder(_stored({**SPEC, "generation": "2.3", "video_decoder": "conv"}))


def test_costs_are_the_seeds_15x_and_load_the_diffusion_weights():
    params = {"expect": {"frames": {"dtype": "float32", "shape": [25, 384, 576, 3]}}}
    conv = costs.reference_seconds("decode_video", params)
    diff = costs.reference_seconds("decode_video", {**params, "decoder": "diffusion"})
    assert 13 < diff / conv < 17
    assert costs.peak_bytes("decode_video", {**params, "decoder": "diffusion"}) > costs.peak_bytes(
        "decode_video", params
    )


FLEET = '[[workers]]\nname = "studio"\nchip = "Apple M4 Pro"\nmemory_gb = 48\ngeneration = "GEN"\ncount = 2\n'


def _plan(tmp_path, generation: str, decoder: str):
    import subprocess
    import sys

    (tmp_path / "fleet.toml").write_text(FLEET.replace("GEN", generation))
    code = "from farm_cli.main import main; main()"
    args = ["plan", "-p", "fox", "-H", "512", "-W", "768", "-f", "49", "--pack", "dgrauet/ltx-2.5-mlx-q8"]
    return subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            *args,
            "--fleet",
            str(tmp_path / "fleet.toml"),
            "--video-decoder",
            decoder,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"FARM_DATA": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.timeout(150)
def test_farm_plan_tiles_and_prices_the_diffusion_decode(tmp_path):
    diffusion, conv = _plan(tmp_path, "2.5", "diffusion"), _plan(tmp_path, "2.5", "conv")
    assert diffusion.returncode == 0 and conv.returncode == 0, diffusion.stderr + conv.stderr
    assert "decode tiles 96,512,512 (2 tiles)" in diffusion.stdout and "2 decode_tile" in diffusion.stdout

    def wall(out: str) -> float:
        return float(out.split("predicted wall time: ")[1].split(" s")[0])

    assert wall(diffusion.stdout) > wall(conv.stdout) + 30  # the decode alone: ~7 s conv, ~69 s in two tiles
    refused = _plan(tmp_path, "2.3", "diffusion")
    assert refused.returncode == 2 and "needs an LTX-2.5 pack" in refused.stderr.strip().splitlines()[-1]


@pytest.mark.timeout(120)
def test_help_shows_the_flag(tmp_path):
    """`submit --help` renders (a `[/FILE]` in --lora's help once broke rich's markup) and lists the flag."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "from farm_cli.main import main; main()", "submit", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"FARM_DATA": str(tmp_path), "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )
    assert done.returncode == 0 and "--video-decoder" in done.stdout, done.stderr[-1500:]


@pytest.mark.timeout(60)
def test_a_keyframed_render_decodes_with_its_images_past_frame_0_each_tile_its_planes():
    """No DFR: the diffusion decode's planes are the `--image`s past frame 0 (their full-size encodes, in
    frame order), each tile reading only the ones it attends to; the first frame's image is no plane,
    and the conv decoder's tasks get none."""
    import numpy as np

    from coordinator.plan.render import normalize_spec, plan_render, validate_spec
    from ltx_engine.rules.dfr_epilogue import task_keyframes

    fleet = [{"packs": ["p"], "pack_generation": {"p": "2.5"}, "memory_bytes": 2**40}]
    images = [{"frame": f, "blob": c * 64} for f, c in ((0, "a"), (96, "b"), (8, "c"))]
    asked = {**SPEC, "frames": 97, "decode_tiles": "48,192,192", "images": images}
    asked.pop("generation")
    spec = validate_spec(normalize_spec({"prompt": "a fox", **asked}), fleet)
    tiles = [t for t in plan_render(spec, "r") if t["kind"] == "decode_tile"]
    assert len(tiles) > 3 and all(t["params"]["keyframe_frames"] == [8, 96] for t in tiles)
    first, last = tiles[0], tiles[-1]
    assert first["params"]["keyframe_planes"] == [0, 1]  # frame 8 inside, 96 the nearest after
    assert first["inputs"]["keyframe0"] == {"task": "r.image3_s2", "output": "latent"}
    assert last["inputs"]["keyframe1"] == {"task": "r.image2_s2", "output": "latent"}
    planes = {f"keyframe{i}": np.full((1, 2, 1, 1, 1), i, np.float32) for i in (0, 1)}
    got, frames = task_keyframes({**last["params"], "keyframe_planes": [1]}, planes)
    assert frames == (96,) and got.ravel().tolist() == [1.0, 1.0]
    conv = validate_spec(normalize_spec({"prompt": "a fox", **asked, "video_decoder": "conv"}), fleet)
    decodes = [t for t in plan_render(conv, "r") if t["kind"].startswith("decode_")]
    assert decodes and all("keyframe_planes" not in t["params"] for t in decodes)
    alone = validate_spec(normalize_spec({"prompt": "a fox", **asked, "images": images[:1]}), fleet)
    assert all("keyframe_planes" not in t["params"] for t in plan_render(alone, "r") if t["kind"] == "decode_tile")
