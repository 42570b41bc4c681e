"""IC-LoRA control on a real farm: a PyAV-written control clip and the tiny IC-LoRA
(`reference_downscale_factor` 2), on one module farm of 2 workers: every task's output is
bit for bit `farm render --local`'s. The control encodes tiled (2 frame tiles) at stage 1's
size over the downscale; stage 1 carries the IC-LoRA and the reference (attention strength 0.5); the
upsample and the tiled stage 2 run on the plain DiT. Dub-It (a clip with picture and sound, the same
LoRA as the Dub-It LoRA) on the same farm: the reference encoded at each stage's size over the
downscale, its track by an `audio_encode` task, both stages with the LoRA and their reference, stage 2's
audio reference stage 1's audio; its stage 2 tiled 1x2 too (`stage2.prep` takes both references, every
tile forward runs with the LoRA on the reference tokens the cut hands it). Both again `--chunked` (25 frames
in 2 windows of 17 carrying 9): each window's own slice of the clip (and track), every output and the joined
frames bit for bit `--local`'s. `--control-stage2` (the MLX port's control-aware refine) with `--control-mask`
(upstream's attention-mask video): the control encoded at each stage's size, the mask clip pooled to each
reference's tokens, stage 2 with the IC-LoRA and its reference at the mask's strengths x 0.5.
The control's stage 1 runs ganged over the 2 workers (`--stage1-parallel 2`): the reference tokens split
with the video's, the attention-strength mask by query rows; bit for bit `--local`'s 2-way split in one
process, which equals the unsplit stage (tests/unit/test_sequence_parallel.py, "control-attention"); the
chunked and stage-2 control renders run stage 1 unsplit (its encodes leave both workers idle when stage 1 is
ready; Dub-It's stage-2 encode runs beside its stage-1 inputs, so its gang is tested on test_sp_gang's 3
workers). Every spec is 128x128, the smallest whose references (stage 1 over the downscale 2) the VAE
encodes: the encode's and stage 2's tiles are given, so a larger size plans the same tasks."""

from __future__ import annotations

import hashlib

import av
import numpy as np
import pytest

from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from farm_cli.local import render_local
from tests.farm.farm_harness import farm, wait_done, wait_until
from tests.media_files import write_clip, write_clip_with_audio, write_ic_lora

SPEC = {
    "prompt": "a fox",
    "height": 128,
    "width": 128,
    "frames": 25,
    "frame_rate": 24.0,
    "seed": 5,
    "pack": "tiny",
    "stage2_tiles": "1x2",
    "tile_overlap": 1,
    "encode_tiles": "24,96",
}


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    folder = tmp_path_factory.mktemp("control")
    clip, lora = write_clip(folder / "depth.mp4", frames=30), write_ic_lora(folder / "ic.safetensors")
    control = {
        **SPEC,
        "control_video": {
            "blob": _sha(clip),
            "strength": 0.9,
            "attention_strength": 0.5,
            "name": "depth.mp4",
        },
        "ic_lora": {"blob": _sha(lora), "strength": 1.0, "downscale": 2, "name": "ic.safetensors"},
        "stage1_parallel": "2",  # a gang of the 2 workers
    }
    talk = write_clip_with_audio(folder / "talk.mp4", frames=30)
    dub = {
        **SPEC,
        "encode_tiles": "24,128",
        "dub_video": {"blob": _sha(talk), "name": "talk.mp4"},
        "ic_lora": control["ic_lora"],
    }
    small = {**SPEC, **CHUNKED}
    chunked = {"control-chunked": {**small, "control_video": control["control_video"], "ic_lora": control["ic_lora"]},
               "dub-chunked": {**small, "encode_tiles": "24,128", "dub_video": dub["dub_video"],
                               "ic_lora": control["ic_lora"]}}
    mask = write_clip(folder / "mask.mp4", frames=28, width=64, height=80)  # --control-mask: a grey-ish clip
    stage2 = {**SPEC, "stage2_tiles": None, "encode_tiles": "24,128", "ic_lora": control["ic_lora"],
              "control_video": {**control["control_video"], "stage2": True},  # --control-stage2, untiled
              "control_mask": {"blob": _sha(mask), "name": "mask.mp4"}}
    return ({"control": control, "dub": dub, "control-stage2": stage2, **chunked},
            {_sha(clip): clip, _sha(lora): lora, _sha(talk): talk, _sha(mask): mask})


@pytest.fixture(scope="module")
def reference(media, local_runner, tmp_path_factory):
    specs, files = media
    local_runner.loras.known.update(
        files
    )  # the client's IC-LoRA, read where it is (as `farm render --local`)
    out = {}
    for name, spec in specs.items():
        path = tmp_path_factory.mktemp(f"{name}-local") / "out.mp4"
        outputs = render_local(spec, path, local_runner, media=files)[1]
        out[name] = {tid.removeprefix("local."): o for tid, o in outputs.items()}
        out[f"{name}.mp4"] = path  # the chunked specs' joined frames are compared too
    return out


@pytest.fixture(scope="module")
def module_farm(redis_server, tiny_packs, tmp_path_factory):
    client = connect(redis_server.url)
    client.flushdb()
    data = tmp_path_factory.mktemp("control-farm")
    (data / "packs").mkdir()
    (data / "packs" / "tiny").symlink_to(
        tiny_packs / "tiny"
    )  # the shelf: the IC-LoRA's keys checked at submit
    # One count: the control's encode tiles and the dub's stage-2 tiles are given, so 2 and 3 workers run
    # the same plan.
    with farm(FarmStore(client), data, tiny_packs, workers=2) as (
        farm_client,
        procs,
    ):
        yield farm_client, procs, data
    client.close()


CHUNKED = {"chunked": True, "chunk_pixel_frames": 17, "chunk_carry_frames": 9, "stage2_tiles": None}


def _submit(farm_client, spec: dict, files: dict) -> tuple[str, dict]:
    """The render's id and its tasks by name, once done."""
    for sha, path in files.items():
        assert farm_client.put_blob(path.read_bytes()) == sha
    render_id = farm_client.submit(spec)
    render = wait_done(farm_client, render_id, timeout=240)
    return render_id, {t["id"].removeprefix(f"{render_id}."): t for t in render["tasks"]}


def _render(farm_client, spec: dict, files: dict) -> dict:
    return _submit(farm_client, spec, files)[1]


def _frames(path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _check_control(tasks: dict, local: dict) -> None:
    assert {name: tasks[name].get("outputs") or {} for name in local} == local  # every output, bit for bit
    kinds = [t["kind"] for t in tasks.values()]
    assert kinds.count("video_encode") == 2 and kinds.count("video_encode_blend") == 1
    assert {tasks[f"control.t{i}"]["params"]["height"] for i in range(2)} == {32}  # 64 px stage 1 / 2
    stage1 = tasks["stage1"]
    assert stage1["inputs"]["control_latent"] == tasks["control"]["outputs"]["latent"]
    assert [lora["name"] for lora in stage1["params"]["loras"]] == ["ic.safetensors"]
    assert stage1["params"]["control"] == {"strength": 0.9, "downscale": 2, "attention_strength": 0.5}
    later = [t for t in tasks.values() if t["kind"] in ("transformer_forward", "upsample_spatial")]
    assert later and not any(t["params"].get("loras") or t["params"].get("control") for t in later)


def _check_dub(tasks: dict, local: dict) -> None:
    assert {name: tasks[name].get("outputs") or {} for name in local} == local  # every output, bit for bit
    s1, s2 = tasks["stage1"], tasks["stage2.prep"]  # stage 2 tiled 1x2: its prep takes the references
    assert (s1["params"]["height"], tasks["dub_s1"]["params"]["height"]) == (64, 32)
    assert (s2["params"]["height"], tasks["dub_s2"]["params"]["height"]) == (128, 64)
    assert s1["inputs"]["control_latent"] == tasks["dub_s1"]["outputs"]["latent"]
    assert s2["inputs"]["control_latent"] == tasks["dub_s2"]["outputs"]["latent"]
    assert s1["inputs"]["audio_reference"] == tasks["dub_audio"]["outputs"]["latent"]
    assert s2["inputs"]["audio_reference"] == s1["outputs"]["audio_latent"]
    tiles = [
        t for name, t in tasks.items() if name.startswith("stage2.s") and t["kind"] == "transformer_forward"
    ]
    assert len(tiles) == 4 and tasks["stage2"]["kind"] == "tdp_step"
    assert all([lora["name"] for lora in t["params"]["loras"]] == ["ic.safetensors"] for t in (s1, *tiles))
    assert tasks["audio"]["kind"] == "decode_audio"  # the re-voiced track, decoded


@pytest.mark.timeout(600)
def test_control_and_dub_match_local_on_the_farm(module_farm, media, reference):
    """Dub-It, then the control with its stage 1 ganged: every output (and the control's frames) `--local`'s."""
    farm_client, _procs, data = module_farm
    specs, files = media
    wait_until(
        lambda: sum(bool(w.get("packs")) for w in farm_client.workers()) >= 2, 60, "2 workers registered"
    )
    _check_dub(_render(farm_client, specs["dub"], files), reference["dub"])
    render_id, tasks = _submit(farm_client, specs["control"], files)
    _check_control(tasks, reference["control"])
    assert {t.get("worker") for t in tasks.values() if t.get("worker")} <= {"w1", "w2", "coordinator"}
    assert set(tasks) == set(reference["control"])
    np.testing.assert_array_equal(_frames(data / "renders" / render_id / "render.mp4"),
                                  _frames(reference["control.mp4"]))
    stage1 = tasks["stage1"]  # the control's stage 1 as a gang of the 2 workers
    assert stage1["params"]["control"]["attention_strength"] == 0.5 and "control_latent" in stage1["inputs"]
    assert stage1["metrics"]["stage1_parallel"] == 2, stage1["metrics"].get("gang_broke")
    assert sorted(stage1["ranks"]) == ["w1", "w2"]


def _check_windows(tasks: dict, local: dict, encodes: tuple[str, ...]) -> None:
    """Two windows, [0, 17) and [8, 25): each encodes the reference's slice for its own frames (from frame 8
    for the second, its track from 8 / 24 s) and reads it in its stages beside the carry it pins."""
    assert set(tasks) == set(local)
    assert {name: tasks[name].get("outputs") or {} for name in local} == local  # every output, bit for bit
    for k, first in ((0, 0), (1, 8)):
        assert all(tasks[f"w{k}.{name}.t0"]["params"]["first"] == first for name in encodes)
        stage1 = tasks[f"w{k}.stage1"]
        assert stage1["inputs"]["control_latent"] == tasks[f"w{k}.{encodes[0]}"]["outputs"]["latent"]
        assert [lora["name"] for lora in stage1["params"]["loras"]] == ["ic.safetensors"]
    assert "context" in tasks["w1.stage1"]["inputs"] and "audio_pin" in tasks["w1.stage1"]["inputs"]


@pytest.mark.timeout(600)
def test_chunked_control_and_dub_match_local_on_the_farm(module_farm, media, reference):
    """`--chunked` IC-LoRA control and Dub-It, 25 frames in 2 windows, on 2 workers."""
    farm_client, _procs, data = module_farm
    specs, files = media
    done = {}
    for name in ("control-chunked", "dub-chunked"):
        render_id, done[name] = _submit(farm_client, specs[name], files)
        frames = _frames(data / "renders" / render_id / "render.mp4")  # the joined clip, seams crossfaded
        np.testing.assert_array_equal(frames, _frames(reference[f"{name}.mp4"]))
        assert frames.shape[0] == 25
    control, dub = done["control-chunked"], done["dub-chunked"]
    _check_windows(control, reference["control-chunked"], ("control",))
    assert not control["w1.stage2"]["params"].get("loras")  # the clean stage 2
    _check_windows(dub, reference["dub-chunked"], ("dub_s1", "dub_s2"))
    assert dub["w1.dub_audio"]["params"]["start"] == 8 / 24
    assert dub["w1.stage2"]["inputs"]["audio_reference"] == dub["w1.stage1"]["outputs"]["audio_latent"]


@pytest.mark.timeout(600)
def test_control_in_stage2_with_a_mask_matches_local_on_the_farm(module_farm, media, reference):
    """`--control-stage2 --control-mask`: the control encoded again at stage 2's size, the mask clip read at
    stage 1's size and pooled to each reference's grid; stage 2 runs with the IC-LoRA, the full-size
    reference and its mask; every output and the frames bit for bit `--local`'s."""
    farm_client, _procs, data = module_farm
    specs, files = media
    render_id, tasks = _submit(farm_client, specs["control-stage2"], files)
    local = reference["control-stage2"]
    assert set(tasks) == set(local)
    assert {name: tasks[name].get("outputs") or {} for name in local} == local  # every output, bit for bit
    np.testing.assert_array_equal(_frames(data / "renders" / render_id / "render.mp4"),
                                  _frames(reference["control-stage2.mp4"]))
    s1, s2 = tasks["stage1"], tasks["stage2"]
    assert (tasks["control.t0"]["params"]["height"], tasks["control_s2.t0"]["params"]["height"]) == (32, 64)
    assert s1["inputs"]["control_latent"] == tasks["control"]["outputs"]["latent"]
    assert s2["inputs"]["control_latent"] == tasks["control_s2"]["outputs"]["latent"]
    masks = (tasks["control_mask"], tasks["control_s2_mask"])
    assert [m["params"]["grid"] for m in masks] == [[4, 1, 1], [4, 2, 2]]  # each reference's tokens
    assert all(m["params"]["height"] == 64 and m["kind"] == "control_mask" for m in masks)  # stage 1's size
    for stage, mask in zip((s1, s2), masks, strict=True):
        assert stage["inputs"]["control_mask"] == mask["outputs"]["mask"]
        assert [lora["name"] for lora in stage["params"]["loras"]] == ["ic.safetensors"]
        assert stage["params"]["control"] == {"strength": 0.9, "downscale": 2, "attention_strength": 0.5}
