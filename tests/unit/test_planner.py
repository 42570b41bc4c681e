"""The job compiler is a pure function: spec → stage graph, with validation before anything is queued."""

from __future__ import annotations

import pytest

from coordinator.plan.render import SpecError, normalize_spec, plan_render, validate_spec

SPEC = {"prompt": "a fox", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 3}


def _plan(**changes) -> list[dict]:
    spec = normalize_spec({**SPEC, **changes})
    spec = validate_spec(spec, [])
    return plan_render(spec, "r")


def test_two_stage_graph_in_topological_order():
    tasks = _plan()
    names = [t["id"].removeprefix("r.") for t in tasks]
    assert names == ["text", "stage1", "upsample", "stage2", "decode", "audio"]
    seen = set()
    for task in tasks:
        assert set(task["deps"]) <= seen
        seen.add(task["id"])
    stage1 = tasks[1]
    assert stage1["params"]["height"] == 128 and stage1["params"]["width"] == 192
    assert stage1["params"]["sigmas"][0] == 1.0 and len(stage1["params"]["sigmas"]) == 9
    assert tasks[3]["params"]["sigmas"] == [0.909375, 0.725, 0.421875, 0.0]
    assert tasks[3]["params"]["expect"]["video_latent"]["shape"] == [1, -1, 4, 8, 12]


def test_image_condition_adds_encodes_at_both_resolutions():
    tasks = _plan(image={"blob": "ab" * 32, "frame": 0, "strength": 0.9})
    encodes = [t for t in tasks if t["kind"] == "image_encode"]
    assert [(t["params"]["height"], t["params"]["width"]) for t in encodes] == [(128, 192), (256, 384)]
    stage2 = next(t for t in tasks if t["id"] == "r.stage2")
    assert stage2["params"]["images"] == [{"frame": 0, "strength": 0.9, "binding": "replace", "input": "image1_latent"}]
    assert stage2["inputs"]["image1_latent"] == {"task": "r.image1_s2", "output": "latent"}


def test_tiled_stage2_expands_into_steps_and_tiles():
    tasks = _plan(stage2_tiles="2x2")
    forwards = [t for t in tasks if t["kind"] == "transformer_forward"]
    steps = [t for t in tasks if t["kind"] == "tdp_step"]
    assert len(forwards) == 8 and len(steps) == 2 and steps[-1]["id"] == "r.stage2"
    assert all(t["capability"] == "coordinator" for t in steps)
    assert {t["params"]["tile_index"] for t in forwards} == {0, 1, 2, 3}


@pytest.mark.parametrize("bad", [{"prompt": " "}, {"width": 300}, {"frames": 26}, {"seed": -2},
                                 {"stage2_tiles": "9x9"}, {"stage2_tiles": "zz"},
                                 {"image": {"blob": "x", "frame": 99}}])
def test_bad_specs_are_refused(bad):
    with pytest.raises(SpecError):
        _plan(**bad)


def test_fleet_limits_pack_and_memory():
    spec = normalize_spec({**SPEC, "pack": "big"})
    with pytest.raises(SpecError, match="unknown pack"):
        spec = validate_spec(spec, [{"packs": ["tiny"], "memory_bytes": 1 << 36}])
    with pytest.raises(SpecError, match="GiB"):
        validate_spec(normalize_spec({**SPEC, "height": 2048, "width": 2048, "frames": 257}),
                      [{"packs": ["tiny"], "memory_bytes": 1 << 30}])


def test_auto_tiling_follows_the_fleet_and_is_recorded():
    spec = normalize_spec({**SPEC, "stage2_tiles": "auto"})
    spec = validate_spec(spec, [{"packs": ["tiny"]}] * 4)
    assert spec.stage2_tiles == "1x2x2"
    wide = normalize_spec({**SPEC, "height": 1088, "width": 1920, "frames": 121, "stage2_tiles": "auto"})
    wide = validate_spec(wide, [{"packs": ["tiny"]}] * 4)  # four columns of 34x19 cells beat 2x2's 20x33 quadrant
    assert wide.stage2_tiles == "1x1x4"


ALL = ["text_encoder", "connector", "transformer", "spatial_upscaler", "vae_decoder", "vae_encoder", "audio_vae",
       "vocoder", "temporal_upscaler"]


def _holder(components: list[str], problems: dict | None = None) -> dict:
    return {"packs": ["p"], "memory_bytes": 2**40, "pack_components": {"p": components},
            "pack_problems": {"p": problems} if problems else {}}


def test_tasks_name_the_components_they_need():
    tasks = {t["id"].removeprefix("r."): t for t in _plan(pack="p", image={"blob": "ab" * 32}, text_encoder="pack")}
    assert tasks["text"]["params"]["needs"] == ["text_encoder", "connector"] and tasks["text"]["params"]["pack"] == "p"
    assert tasks["stage1"]["params"]["needs"] == ["transformer"]
    assert tasks["upsample"]["params"]["needs"] == ["spatial_upscaler", "vae_decoder"]
    assert tasks["image1_s1"]["params"]["needs"] == ["vae_encoder"]
    tiled = _plan(pack="p", stage2_tiles="1x2")
    assert all("needs" not in t["params"] for t in tiled if t["capability"] == "coordinator")
    assert all("needs" in t["params"] for t in tiled if t["capability"] == "mlx")


@pytest.mark.parametrize(("changes", "lacking", "match"), [
    ({}, "spatial_upscaler", r"^pack 'p' has no spatial_upscaler \(spatial_upscaler_x2_v1_1\.safetensors\): get it with "
                             r"`mlx-forge convert ltx-2\.3 --spatial-upscaler x2`$"),
    ({"image": {"blob": "ab" * 32}}, "vae_encoder", r"has no vae_encoder \(vae_encoder\.safetensors\)"),
    ({"temporal_upscalings": 1, "frames": 49}, "temporal_upscaler",
     r"has no temporal_upscaler .*`mlx-forge convert ltx-2\.3 --temporal-upscaler x2`"),
    ({"pack": "dgrauet/ltx-2.3-mlx-q8", "text_encoder": "pack"}, "text_encoder", r"has no text_encoder \(text_encoder/\)"),
])
def test_a_render_needing_a_missing_component_is_refused_in_one_line(changes, lacking, match):
    spec = normalize_spec({**SPEC, "pack": "p", **changes})
    holder = _holder([c for c in ALL if c != lacking])
    holder["packs"] = [spec.pack]
    holder["pack_components"] = {spec.pack: holder["pack_components"]["p"]}
    with pytest.raises(SpecError, match=match) as info:
        spec = validate_spec(spec, [holder])
    assert "\n" not in str(info.value)


def test_missing_parts_refuse_only_the_renders_that_need_them():
    without_extras = _holder([c for c in ALL if c not in ("vae_encoder", "temporal_upscaler")])
    validate_spec(normalize_spec({**SPEC, "pack": "p"}), [without_extras])  # plain t2v still renders
    spread = [_holder(["text_encoder", "connector", "transformer"]),
              _holder(["spatial_upscaler", "vae_decoder", "audio_vae", "vocoder"])]
    validate_spec(normalize_spec({**SPEC, "pack": "p"}), spread)  # the scheduler sends each task where it fits
    validate_spec(normalize_spec({**SPEC, "pack": "p"}), [{"packs": ["p"], "memory_bytes": 2**40}])  # says nothing


def test_the_workers_reason_wins_over_the_generic_line():
    why = "/packs/p/transformer-dev.safetensors: the dev DiT is quantized; fusing x needs bf16 dev weights"
    holder = _holder([c for c in ALL if c != "transformer"], {"transformer": why})
    with pytest.raises(SpecError, match="the dev DiT is quantized"):
        validate_spec(normalize_spec({**SPEC, "pack": "p"}), [holder])
