"""Keyframes in the task graph, without Redis: one encode task per image per stage resolution, every
stage (and stage-2 tile, and DFR tile in whose window it falls) carrying its images, the CRF the encode
runs at, and the spec's one-line refusals. The tile windows are the engine's own (`tdp.token_sets`)."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.plan.render import SpecError, normalize_spec, plan_render, validate_spec
from ltx_engine.conditioning import ImageCondition
from ltx_engine.denoise import StageInputs, build_stage_states
from ltx_engine.rules import tdp
from protos.spec import MAX_IMAGES, RenderSpec

pytestmark = pytest.mark.timeout(60)
SPEC = {"prompt": "a fox", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 3, "pack": "p"}
FLEET_23 = [{"packs": ["p"], "memory_bytes": 2**40, "pack_generation": {"p": "2.3"}}]
FLEET_25 = [{"packs": ["p"], "memory_bytes": 2**40, "pack_generation": {"p": "2.5"},
             "pack_features": {"p": ["temporal_upscaler", "keyframes"]}}]


def _blob(k: int) -> str:
    return f"{k:02x}" * 32


def _tasks(images: list[dict], fleet=FLEET_23, **changes) -> dict[str, dict]:
    spec = validate_spec(normalize_spec({**SPEC, **changes, "images": images}), fleet)
    return {t["id"].removeprefix("r."): t for t in plan_render(spec, "r")}


def test_four_keyframes_are_eight_encode_tasks_each_on_its_own_image():
    images = [{"blob": _blob(k), "frame": f, "strength": 0.9} for k, f in enumerate((0, 8, 16, "last"), 1)]
    tasks = _tasks(images)
    encodes = {n: t for n, t in tasks.items() if t["kind"] == "image_encode"}
    assert sorted(encodes) == [f"image{k}_{s}" for k in range(1, 5) for s in ("s1", "s2")]
    assert all(t["deps"] == [] for t in encodes.values())  # nothing orders them: they run on several Macs at once
    for k in range(1, 5):
        s1, s2 = encodes[f"image{k}_s1"], encodes[f"image{k}_s2"]
        assert s1["inputs"] == s2["inputs"] == {"image": {"blob": _blob(k)}}
        assert (s1["params"]["height"], s1["params"]["width"], s2["params"]["height"]) == (128, 192, 256)
        assert tasks["stage1"]["inputs"][f"image{k}_latent"] == {"task": f"r.image{k}_s1", "output": "latent"}
        assert tasks["stage2"]["inputs"][f"image{k}_latent"] == {"task": f"r.image{k}_s2", "output": "latent"}
    assert [(im["frame"], im["binding"]) for im in tasks["stage1"]["params"]["images"]] == [
        (0, "replace"), (8, "guide"), (16, "guide"), (24, "guide")]  # auto: frame 0 replaces, others guide
    assert tasks["stage1"]["params"]["images"] == tasks["stage2"]["params"]["images"]


@pytest.mark.parametrize(("fleet", "given", "crf"), [(FLEET_23, None, 33), (FLEET_25, None, 18), (FLEET_25, 0, 0),
                                                    (FLEET_23, 40, 40), ([], None, None)])
def test_the_encode_runs_at_the_spec_crf_else_the_generation_default(fleet, given, crf):
    image = {"blob": _blob(1), "frame": 0, **({} if given is None else {"crf": given})}
    params = _tasks([image], fleet)["image1_s1"]["params"]
    assert params.get("crf") == crf  # None: the worker's pack generation decides, by the same rule


def test_tiled_stage2_prepares_with_every_image_and_its_tiles_keep_the_guides_in_their_window():
    images = [{"blob": _blob(1), "frame": 0, "binding": "replace"}, {"blob": _blob(2), "frame": -1, "binding": "guide"}]
    tasks = _tasks(images, stage2_tiles="2x1x1", tile_overlap=1)
    prep = tasks["stage2.prep"]
    assert {"image1_latent", "image2_latent"} <= set(prep["inputs"]) and prep["params"]["images"][1]["frame"] == 24
    # the state the prep task builds, and the engine's tile windows over it (frames split in two)
    grid, rng = (4, 2, 3), np.random.default_rng(0)
    latents = [rng.standard_normal((1, 8, 1, 2, 3)).astype(np.float32) for _ in images]
    conds = tuple(ImageCondition(lat, im["frame"], im["strength"], im["binding"])
                  for lat, im in zip(latents, prep["params"]["images"], strict=True))
    inputs = StageInputs(frames=25, height=64, width=96, fps=24.0, seed=1, sigmas=[0.9, 0.0], contexts={},
                         audio_frames=4, images=conds)
    video, _ = build_stage_states(inputs, 8)
    generated = int(np.prod(grid))
    assert video.num_tokens == generated + 6  # one guide frame appended, the replace in place
    sets = tdp.token_sets(grid, (2, 1, 1), 1, video.positions)
    guide = set(range(generated, generated + 6))
    assert not guide & set(sets[0].cond_indices.tolist())  # the first frames' tile: the last-frame guide is not there
    assert guide <= set(sets[1].cond_indices.tolist())


def test_dfr_stage2_tiles_read_the_slots_after_every_guide_and_rounds_carry_the_images_in_their_window():
    images = [{"blob": _blob(1), "frame": 0}, {"blob": _blob(2), "frame": 48, "binding": "guide"},
              {"blob": _blob(3), "frame": "last"}]
    tasks = _tasks(images, FLEET_25, frames=97, temporal_upscalings=1, stage2_tiles="1x2", tile_overlap=1)
    cut = tasks["stage2.cut"]["params"]
    f, h, w = cut["grid"]
    assert cut["slot_range"][0] == f * h * w + 2 * h * w  # two guides (frames 48 and 96) before the slots
    tiles = sorted((t for t in tasks.values() if t["kind"] == "dfr_tile"), key=lambda t: t["params"]["tile_index"])
    assert len(tiles) >= 2
    assert [im["input"] for im in tiles[0]["params"]["images"]] == ["image1_latent", "image2_latent", "image3_latent"]
    last = tiles[-1]
    held = [im["input"] for im in last["params"]["images"]]
    # frame 0 is outside the last tile's window (96..192), and frame 48 (96 on round 1's doubled clip) sits in
    # its pinned prefix (96..128: the tile before it holds that image); it denoises 129..192
    assert held == ["image3_latent"] and [im["frame"] for im in last["params"]["images"]] == [192]
    assert [im["frame"] for im in tiles[0]["params"]["images"]] == [0, 96, 192]
    assert {k for k in last["inputs"] if k.startswith("image")} == set(held)


@pytest.mark.parametrize(("images", "line"), [
    ([{"frame": 25}], r"image frame 25 is outside 0\.\.24"),
    ([{"frame": -26}], r"image frame -26 is outside 0\.\.24"),
    ([{"frame": 0}, {"frame": 0, "binding": "replace"}], "images 1 and 2 both replace latent frame 0"),
    ([{"frame": -8, "binding": "replace"}, {"frame": 17, "binding": "replace"}], "images 1 and 2 both replace latent frame 3"),
    ([{"frame": 5, "binding": "replace"}], r"replace needs frame 0 or 1 \+ 8k"),
])
def test_frames_the_clip_cannot_take_are_refused_in_one_line(images, line):
    images = [{"blob": _blob(k), **im} for k, im in enumerate(images, 1)]
    with pytest.raises(SpecError, match=line) as refused:
        _tasks(images)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("images", "line"), [
    ([{"frame": 0}] * (MAX_IMAGES + 1), f"{MAX_IMAGES + 1} images: at most {MAX_IMAGES}"),
    ([{"frame": 0, "crf": 52}], "image 1 crf"),
    ([{"frame": 0, "crf": -1}], "image 1 crf"),
    ([{"frame": 0, "binding": "over"}], "image 1 binding 'over' is not one of replace, guide, auto"),
    ([{"frame": "first"}], "image 1 frame"),
])
def test_the_spec_refuses_what_is_not_an_image_list(images, line):
    with pytest.raises(SpecError, match=line):
        RenderSpec.from_dict({**SPEC, "images": images})


def test_an_older_client_single_image_is_the_first_of_images():
    spec = RenderSpec.from_dict({**SPEC, "image": {"blob": _blob(1), "frame": 8, "strength": 0.5}})
    assert [im.to_dict() for im in spec.images] == [{"blob": _blob(1), "frame": 8, "strength": 0.5}]
    assert "image" not in spec.to_dict() and spec.to_dict()["images"][0]["frame"] == 8
    assert RenderSpec.from_dict(spec.to_dict()) == spec  # the stored form reads back the same


def test_generated_keyframes_are_stage1_slots_at_evenly_spaced_interior_frames():
    tasks = _tasks([], FLEET_25, num_generated_keyframes=3, frames=49)
    stage1, stage2 = tasks["stage1"]["params"], tasks["stage2"]["params"]
    assert stage1["generated_slots"] == [12, 24, 36]  # linspace(0, 48, 5) without its ends
    assert stage1["expect"]["slots"]["shape"] == [1, -1, 3, 4, 6] and stage1["sampler"] == "euler_ancestral"
    assert "generated_slots" not in stage2 and "dfr_slots" not in stage2 and "slots" not in tasks["stage2"]["inputs"]
    assert _tasks([], FLEET_25, num_generated_keyframes=2)["stage1"]["params"]["generated_slots"] == [8, 16]


def test_the_diffusion_decoder_has_stage2_carry_the_generated_keyframes_and_reads_them():
    """Upstream's DFR rule for carrying slots: stage 1's, upsampled, are stage 2's slots' initial latent;
    every diffusion decode task reads stage 2's slots as its planes (they supersede the images')."""
    images = [{"blob": _blob(1), "frame": 12}]
    tasks = _tasks(images, FLEET_25, num_generated_keyframes=1, frames=17, width=256, height=64,
                   video_decoder="diffusion", decode_tiles="48,192,192")
    assert tasks["stage1"]["params"]["generated_slots"] == [8]
    upsample = tasks["upsample.slots"]
    assert upsample["inputs"] == {"latent": {"task": "r.stage1", "output": "slots"}}
    assert upsample["params"]["expect"]["latent"]["shape"] == [1, -1, 1, 2, 8]
    stage2 = tasks["stage2"]
    assert stage2["params"]["generated_slots"] == [8] and "dfr_slots" not in stage2["params"]
    assert stage2["inputs"]["slots"] == {"task": "r.upsample.slots", "output": "latent"}
    assert stage2["params"]["expect"]["slots"]["shape"] == [1, -1, 1, 2, 8]
    decodes = [t for t in tasks.values() if t["kind"] == "decode_tile"]
    assert len(decodes) == 3
    for t in decodes:
        assert (t["params"]["keyframe_frames"], t["params"]["keyframe_planes"]) == ([8], [0])
        assert t["inputs"]["keyframes"] == {"task": "r.stage2", "output": "slots"} and "keyframe0" not in t["inputs"]
    tiled = _tasks([], FLEET_25, num_generated_keyframes=2, video_decoder="diffusion", stage2_tiles="2x2")
    hw = (256 // 32) * (384 // 32)  # a latent frame's tokens at 256x384
    assert tiled["stage2.cut"]["params"]["slot_range"] == [4 * hw, 6 * hw]  # read out of the tiles' tokens


def test_the_conv_decoder_leaves_stage2_as_upstream_without_the_slots():
    tasks = _tasks([], FLEET_25, num_generated_keyframes=1, frames=17)
    assert "upsample.slots" not in tasks and "slots" not in tasks["stage2"]["params"]["expect"]


GUIDED = {"steps": 2, "height": 128, "width": 128, "frames": 17}


@pytest.mark.parametrize(("pipeline", "stage", "size"), [("one-stage", "stage1", 128), ("two-stage", "stage1", 64),
                                                          ("two-stage-hq", "stage1", 64)])
def test_a_guided_stage_carries_the_generated_keyframes_in_every_pass(pipeline, stage, size):
    """Upstream forwards the slots to the guided first stage: its prep appends them after the image guide,
    every pass reads the LTX-2.5 marker (first latent frame + the slots' tokens), the last guide step reads
    the slots out."""
    images = [{"blob": _blob(1), "frame": 12, "binding": "guide"}]
    tasks = _tasks(images, FLEET_25, pipeline=pipeline, num_generated_keyframes=1, **GUIDED)
    assert tasks[f"{stage}.prep"]["params"]["generated_slots"] == [8]
    hw = (size // 32) ** 2
    grid, slots = [3, size // 32, size // 32], [3 * hw + hw, 3 * hw + 2 * hw]  # after the guide's latent frame
    passes = [t for name, t in tasks.items() if name.startswith(f"{stage}.") and t["kind"] == "guidance_pass"]
    assert passes and all(t["params"]["marker"] is True and t["params"]["grid"] == grid
                          and t["params"]["slot_range"] == slots for t in passes)
    assert tasks[stage]["params"]["finish"]["slot_range"] == slots
    assert tasks[stage]["params"]["expect"]["slots"]["shape"] == [1, -1, 1, size // 32, size // 32]


def test_the_guided_recipes_diffusion_decode_reads_the_full_size_slots():
    """One-stage: stage 1's slots are full size, the decode reads them; two-stage HQ: stage 2 (guided
    res_2s passes) carries them, upsampled, and reads them out as its last step's `slots`."""
    one = _tasks([], FLEET_25, pipeline="one-stage", num_generated_keyframes=1, video_decoder="diffusion", **GUIDED)
    assert "upsample.slots" not in one
    decodes = [t for t in one.values() if t["kind"] == "decode_video"]
    assert decodes and all(t["inputs"]["keyframes"] == {"task": "r.stage1", "output": "slots"} for t in decodes)
    hq = _tasks([], FLEET_25, pipeline="two-stage-hq", num_generated_keyframes=1, video_decoder="diffusion", **GUIDED)
    assert hq["upsample.slots"]["inputs"] == {"latent": {"task": "r.stage1", "output": "slots"}}
    assert hq["stage2.prep"]["inputs"]["slots"] == {"task": "r.upsample.slots", "output": "latent"}
    assert hq["stage2"]["params"]["finish"]["slot_range"] == [3 * 16, 4 * 16]
    passes = [t for n, t in hq.items() if n.startswith("stage2.") and t["kind"] == "guidance_pass"]
    assert passes and all(t["params"]["slot_range"] == [3 * 16, 4 * 16] for t in passes)
    decodes = [t for t in hq.values() if t["kind"] == "decode_video"]
    assert decodes and all(t["inputs"]["keyframes"] == {"task": "r.stage2", "output": "slots"} for t in decodes)


def test_a_guided_pass_on_a_23_pack_reads_no_marker():
    tasks = _tasks([], FLEET_23, pipeline="one-stage", **GUIDED)
    assert not any("marker" in t["params"] for t in tasks.values() if t["kind"] == "guidance_pass")


@pytest.mark.parametrize(("fleet", "changes", "line"), [
    (FLEET_23, {}, "needs an LTX-2.5 pack"),
    ([], {}, "needs an LTX-2.5 pack"),
    (FLEET_25, {"temporal_upscalings": 1, "frames": 49}, "--num-generated-keyframes does not apply to the dfr recipe "
     "\\(--dfr: it places its own keyframe slots\\); it applies to: distilled, one-stage, two-stage, two-stage-hq, "
     "ic-lora, dub-it$"),
    (FLEET_25, {"frames": 9, "num_generated_keyframes": 8}, "do not fit between the first and last of 9 frames"),
])
def test_generated_keyframes_that_cannot_render_are_refused(fleet, changes, line):
    with pytest.raises(SpecError, match=line):
        _tasks([], fleet, **{"num_generated_keyframes": 2, **changes})
