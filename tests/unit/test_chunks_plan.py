"""Chunked renders (`--chunked`), pure: the window plan, the graph of a 3-window distilled render (each
window after the first pinned on the one before's carried frames and audio), the seams crossfaded by the
assembler's join, the windows' audio joined to the clip's length, each window's own segments (`--segment`),
and the one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.assemble.chunk_frames import joined_frames
from coordinator.plan.graph import mark_lead, upstream_of
from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from coordinator.reduce.chunks import chunk_audio_join, chunk_carry
from ltx_engine.rules.chunks import ChunkError, ChunkLayout, Window, seam_weight
from ltx_engine.rules.prompt_relay import RELAY
from protos.fields import SpecError

pytestmark = pytest.mark.timeout(60)

SPEC = {"prompt": "a fox", "height": 64, "width": 128, "frames": 33, "seed": 3, "pack": "tiny", "chunked": True,
        "chunk_pixel_frames": 17, "chunk_carry_frames": 9, "decode_tiles": "off"}


def test_windows_start_a_carry_before_the_last_one_ends_and_the_last_is_cut_to_the_clip():
    assert ChunkLayout(169).windows == (Window(0, 0, 97, 0), Window(1, 72, 97, 25))  # upstream's 97 / 25
    assert ChunkLayout(33, 17, 9).windows == (Window(0, 0, 17, 0), Window(1, 8, 17, 9), Window(2, 16, 17, 9))
    short = ChunkLayout(49, 33, 9).windows
    assert short == (Window(0, 0, 33, 0), Window(1, 24, 25, 9)) and short[-1].stop == 49
    lay = ChunkLayout(361, fps=24.0)  # 15 s in windows of 97: each adds 72 frames
    assert [w.start for w in lay.windows] == [0, 72, 144, 216, 288] and lay.windows[-1].stop == 361
    assert lay.carry_audio == 26 and lay.carry_audio_slice(lay.windows[0]) == slice(75, 101)
    assert ChunkLayout(169, blend=8).blend_span(Window(1, 72, 97, 25)) == (89, 97)


@pytest.mark.parametrize(("numbers", "line"), [
    ((33, 17, 17, 8), "--chunk-carry-frames 17 is not shorter than the window's 17 frames"),
    ((33, 18, 9, 8), "--chunk-pixel-frames 18 is not of the form 8k+1 (e.g. 97)"),
    ((33, 17, 8, 4), "--chunk-carry-frames 8 is not of the form 8k+1 (e.g. 25)"),
    ((17, 17, 9, 4), "--chunked: 17 frames fit one window of 17: give -f above it, or drop --chunked"),
    ((33, 17, 9, 9), "--chunk-blend-frames 9: 0 to 8 (inside the carried frames, after the first)"),
])
def test_layouts_that_cannot_be_laid_out_say_why(numbers, line):
    with pytest.raises(ChunkError) as refused:
        ChunkLayout(*numbers)
    assert str(refused.value) == line


def _tasks(**extra) -> dict[str, dict]:
    return {t["id"]: t for t in plan_render(validate_spec(normalize_spec({**SPEC, **extra}), []), "r")}


def test_each_window_after_the_first_is_pinned_on_the_last_frames_and_audio_of_the_one_before():
    tasks = _tasks()
    assert [tid for tid, t in tasks.items() if t["kind"] == "denoise_stage1"] == ["r.w0.stage1", "r.w1.stage1",
                                                                                  "r.w2.stage1"]
    assert "context" not in tasks["r.w0.stage1"]["inputs"] and tasks["r.w0.stage1"]["params"]["images"] == []
    for k in (1, 2):
        s1, s2 = tasks[f"r.w{k}.stage1"], tasks[f"r.w{k}.stage2"]
        assert s1["params"]["frames"] == 17 and s1["params"]["seed"] == 3 + k  # each window its own noise
        pinned = {"input": "context", "frame": 0, "strength": 1.0, "binding": "replace"}
        assert s1["params"]["images"] == s2["params"]["images"] == [pinned]
        assert s1["inputs"]["context"] == {"task": f"r.w{k}.context_s1", "output": "latent"}
        assert s2["inputs"]["context"] == {"task": f"r.w{k}.context_s2", "output": "latent"}
        encode = tasks[f"r.w{k}.context_s1.t0"]
        assert encode["inputs"] == {"frames": {"task": f"r.w{k - 1}.carry", "output": "frames"}}
        assert encode["params"]["frames"] == 9 and encode["params"]["height"] == 32  # stage 1's half size
        carry = tasks[f"r.w{k - 1}.carry"]
        assert carry["capability"] == "coordinator" and carry["params"]["carry"] == 9
        assert carry["inputs"] == {"frames": {"task": f"r.w{k - 1}.decode", "output": "frames"}}
        pin = tasks[f"r.w{k}.audio_pin"]
        assert pin["inputs"]["latent"] == {"task": f"r.w{k - 1}.stage1", "output": "audio_latent"}
        assert (pin["params"]["start"], pin["params"]["stop"]) == (18 - 9, 18)
        assert s1["inputs"]["audio_pin"]["task"] == f"r.w{k}.audio_pin" and s1["params"]["audio_pin_start"] == 0
    join = tasks["r.audio_join"]
    assert sorted(join["inputs"]) == ["w0", "w1", "w2"] and tasks["r.audio"]["inputs"]["latent"]["task"] == join["id"]
    assert "r.w2.carry" not in tasks and "r.decode" not in tasks
    order = list(tasks)
    assert all(order.index(d) < order.index(tid) for tid, t in tasks.items() for d in t["deps"])


def _texts_read(tasks: dict[str, dict], k: int) -> set[str]:
    """The text tasks window k's tasks read their contexts (and relay table) from."""
    keys = ("video_context", "audio_context", "context_mask", RELAY)
    return {ref["task"] for tid, t in tasks.items() if tid.startswith(f"r.w{k}.")
            for name, ref in t["inputs"].items() if name in keys}


def test_each_window_relays_the_segments_it_overlaps_clipped_to_it_on_its_own_clock():
    """Windows of 17 frames from frames 0, 8, 16 ([0, 0.71), [0.33, 1.04), [0.67, 1.375) s): "sleeps" [0, 0.6)
    straddles windows 0 and 1; "runs" [0.6, 1.1) leaves window 0 a sliver of no latent frame (left out)."""
    tasks = _tasks(segments=[{"text": "sleeps", "seconds": 0.6}, {"text": "runs", "seconds": 0.5}])
    relays = {k: tasks[f"r.w{k}.text"]["params"][RELAY]["segments"] for k in range(3)}
    assert relays[0] == [["sleeps", 0.0, 0.6]]
    assert relays[1] == [["sleeps", 0.0, pytest.approx(0.6 - 8 / 24)], ["runs", pytest.approx(0.6 - 8 / 24),
                                                                         pytest.approx(17 / 24)]]
    assert relays[2] == [["runs", 0.0, pytest.approx(1.1 - 16 / 24)]]
    assert all(_texts_read(tasks, k) == {f"r.w{k}.text"} for k in range(3))
    assert "r.text" not in tasks and len({tasks[f"r.w{k}.text"]["params"]["text_key"] for k in range(3)}) == 3
    order = list(tasks)
    assert all(order.index(d) < order.index(tid) for tid, t in tasks.items() for d in t["deps"])


def test_windows_with_equal_segments_share_a_text_task_and_the_rest_read_the_prompts():
    held = _tasks(segments=[{"text": "sleeps", "seconds": 33 / 24}])  # the whole clip: each window alike
    assert [tid for tid, t in held.items() if t["kind"] == "text_encode"] == ["r.w0.text"]
    assert all(_texts_read(held, k) == {"r.w0.text"} for k in range(3))
    early = _tasks(segments=[{"text": "sleeps", "seconds": 0.3}])  # window 0's alone
    assert [tid for tid, t in early.items() if t["kind"] == "text_encode"] == ["r.w0.text", "r.text"]
    assert [_texts_read(early, k) for k in range(3)] == [{"r.w0.text"}, {"r.text"}, {"r.text"}]
    assert RELAY not in early["r.text"]["params"] and early["r.text"]["params"]["text_key"] == _tasks()[
        "r.text"]["params"]["text_key"]
    assert list(early).index("r.text") < list(early).index("r.w1.stage1")


def test_a_latent_carry_pins_the_stage_latents_so_a_window_waits_for_the_last_ones_stage_1_alone():
    tasks = _tasks(chunk_carry="latent")
    assert not any(t["kind"] in ("chunk_carry", "video_encode") for t in tasks.values())
    for k in (1, 2):
        assert tasks[f"r.w{k}.stage1"]["deps"] == ["r.text", f"r.w{k}.audio_pin", f"r.w{k}.carry_s1"]
        for stage in (1, 2):
            cut = tasks[f"r.w{k}.carry_s{stage}"]
            assert cut["params"]["latent_frames"] == 2 and cut["capability"] == "coordinator"
            assert cut["inputs"] == {"latent": {"task": f"r.w{k - 1}.stage{stage}", "output": "video_latent"}}
            assert tasks[f"r.w{k}.stage{stage}"]["inputs"]["context"]["task"] == cut["id"]


def test_a_tiled_window_carries_from_its_decode_tiles():
    tasks = _tasks(decode_tiles="32,96,96", stage2_tiles="1x2", tile_overlap=1)
    carry = tasks["r.w0.carry"]
    assert sorted(carry["inputs"]) == [f"t{i}" for i in range(carry["params"]["tiles"])]
    assert carry["params"]["tiles"] > 1 and carry["params"]["sizes"] == "32,96,96"
    assert any(tid.startswith("r.w1.stage2.") for tid in tasks)  # each window's stage 2 in tiles


def test_the_carry_is_the_windows_last_frames_as_8_bit_rgb():
    frames = np.linspace(0.0, 1.0, 17 * 2 * 3 * 3, dtype=np.float32).reshape(17, 2, 3, 3)
    out = chunk_carry({"frames": 17, "carry": 9}, {"frames": frames})["frames"]
    assert out.dtype == np.uint8 and out.shape == (9, 2, 3, 3)
    np.testing.assert_array_equal(out, np.rint(frames[8:] * 255).astype(np.uint8))


def test_the_joined_clip_crossfades_the_last_blend_frames_of_each_overlap():
    plan = validate_spec(normalize_spec({**SPEC, "chunk_blend_frames": 4}), [])
    windows = {f"w{k}.": np.full((17, 1, 1, 3), float(k + 1), np.float32) + np.arange(17)[:, None, None, None]
               for k in range(3)}

    def window_frames(view, prefix):
        assert view.frames == 17
        return iter(windows[prefix]), {"decode_tiles": 1}

    frames, info = joined_frames(plan, window_frames)
    frames = np.stack(list(frames))[:, 0, 0, 0]
    assert frames.shape == (33,) and info == {"chunk_windows": 3, "decode_tiles": 1}
    np.testing.assert_array_equal(frames[:13], np.arange(13) + 1.0)  # window 0 until the blend
    for i, at in enumerate(range(13, 17)):  # window 0's frames 13..16 into window 1's 5..8
        w = np.float32(seam_weight(i, 4))
        assert frames[at] == np.float32(1 - w) * np.float32(at + 1) + w * np.float32(2 + at - 8)
    np.testing.assert_array_equal(frames[17:21], np.arange(9, 13) + 2.0)  # window 1 after the seam
    np.testing.assert_array_equal(frames[25:], np.arange(9, 17) + 3.0)  # window 2's new frames


def test_the_windows_audio_joins_to_the_clips_length():
    lay = ChunkLayout(33, 17, 9)
    latents = [np.full((1, 2, 18, 4), k, np.float32) for k in range(3)]
    params = {"total": 33, "window": 17, "carry": 9, "blend": 8, "fps": 24.0, "windows": 3}
    joined = chunk_audio_join(params, {f"w{k}": lat for k, lat in enumerate(latents)})["latent"]
    assert joined.shape == (1, 2, round(33 / 24 * 25), 4) and lay.carry_audio == 9
    assert (joined[0, 0, :18] == 0).all() and (joined[0, 0, 18:27] == 1).all() and (joined[0, 0, 27:] == 2).all()


def test_each_window_is_generated_to_the_tracks_slice_for_its_own_frames():
    lay = ChunkLayout(33, 17, 9)
    assert [lay.source_frames(w) for w in lay.windows] == [(0, 17), (8, 25), (16, 33)]  # the carry's frames too
    assert ChunkLayout(49, 33, 9).source_frames(ChunkLayout(49, 33, 9).windows[-1]) == (24, 49)  # the cut last
    assert [lay.track_window(w) for w in lay.windows] == [(0.0, 17 / 24), (8 / 24, 25 / 24), (16 / 24, 33 / 24)]
    assert all(lay.track_window(a)[1] > lay.track_window(b)[0] for a, b in zip(lay.windows, lay.windows[1:], strict=False))


def test_a2v_windows_freeze_their_own_slice_of_the_track_and_the_output_muxes_the_whole_clips():
    """A chunked A2V render plans (no longer refused): each window encodes the track's slice for its frames
    (offset by --audio-start) and freezes it in its stages in place of the carried audio pin."""
    tasks = _tasks(audio_input={"blob": "0" * 64, "start": 0.25, "name": "voice.wav"})
    assert not [tid for tid, t in tasks.items() if t["kind"] in ("extend_audio_pin", "chunk_audio_join",
                                                                  "decode_audio")]
    for k in range(3):
        encode, s1, s2 = tasks[f"r.w{k}.audio"], tasks[f"r.w{k}.stage1"], tasks[f"r.w{k}.stage2"]
        assert encode["kind"] == "audio_encode" and encode["params"]["frames"] == 17
        assert encode["params"]["start"] == 0.25 + 8 * k / 24 and encode["params"]["audio_frames"] == 18
        latent = {"task": encode["id"], "output": "latent"}
        assert s1["inputs"]["audio_latent"] == latent and s2["inputs"]["audio_latent"] == latent
    whole = tasks["r.audio"]
    assert whole["kind"] == "audio_encode" and whole["params"]["frames"] == 33 and whole["params"]["start"] == 0.25


IC = {"blob": "1" * 64, "strength": 1.0, "downscale": 2, "name": "ic.safetensors"}
CONTROL = {"height": 128, "width": 128, "ic_lora": IC, "control_video": {"blob": "2" * 64, "name": "depth.mp4"}}


def test_ic_lora_windows_each_encode_the_control_clips_slice_for_their_own_frames():
    """Each window's stage 1 reads its own encode of the control clip's frames [start, stop) (stage 1's size
    over the downscale) with the IC-LoRA, beside the carry it pins; its stage 2 stays clean."""
    tasks = _tasks(**CONTROL)
    for k in range(3):
        encode, s1 = tasks[f"r.w{k}.control.t0"], tasks[f"r.w{k}.stage1"]
        assert (encode["params"]["first"], encode["params"]["frames"], encode["params"]["height"]) == (8 * k, 17, 32)
        assert encode["inputs"] == {"video": {"blob": "2" * 64}}
        assert s1["inputs"]["control_latent"] == {"task": f"r.w{k}.control", "output": "latent"}
        assert [lora["name"] for lora in s1["params"]["loras"]] == ["ic.safetensors"]
        assert "loras" not in tasks[f"r.w{k}.stage2"]["params"]
        assert ("context" in s1["inputs"]) == (k > 0)
    assert tasks["r.w2.control"]["lead"]  # a later window's stage 1 waits on it: on the chain


def test_dub_it_windows_each_take_the_references_slice_and_its_track_from_their_start():
    tasks = _tasks(height=128, width=128, ic_lora=IC, dub_video={"blob": "3" * 64, "name": "talk.mp4"})
    for k in range(3):
        assert [tasks[f"r.w{k}.dub_s{n}.t0"]["params"]["first"] for n in (1, 2)] == [8 * k, 8 * k]
        assert tasks[f"r.w{k}.dub_audio"]["params"]["start"] == 8 * k / 24
        s1, s2 = tasks[f"r.w{k}.stage1"], tasks[f"r.w{k}.stage2"]
        assert s1["inputs"]["audio_reference"] == {"task": f"r.w{k}.dub_audio", "output": "latent"}
        assert s2["inputs"]["audio_reference"] == {"task": f"r.w{k}.stage1", "output": "audio_latent"}
        assert ("audio_pin" in s1["inputs"]) == (k > 0)  # the carried audio pinned beside the reference


@pytest.mark.parametrize(("extra", "line"), [
    ({**CONTROL, "dfr": True}, "--dfr and --chunked do not compose (DFR's canvas and epilogue span the whole clip)"),
    ({"chunk_carry_frames": 17}, "--chunk-carry-frames 17 is not shorter than the window's 17 frames"),
    ({"chunk_pixel_frames": 20}, "--chunk-pixel-frames 20 is not of the form 8k+1 (e.g. 97)"),
    ({"frames": 17}, "--chunked: 17 frames fit one window of 17: give -f above it, or drop --chunked"),
    ({"dfr": True, "frames": 41}, "--chunked does not apply to the dfr recipe (--dfr); it applies to: distilled, "
                                  "one-stage, two-stage, two-stage-hq, ic-lora, dub-it"),
    ({"chunked": None}, "--chunk-pixel-frames needs --chunked"),
    ({"frames": None}, "--chunked needs -f/--frames: the whole clip's length, above one window"),
    ({"chunk_carry": "pixels"}, "--chunk-carry 'pixels': decoded (upstream's) or latent (ours)"),
    ({"num_generated_keyframes": 1}, "--chunked and --num-generated-keyframes do not compose (a window is "
                                     "conditioned on the one before and its own keyframes alone)"),
])
def test_bad_chunked_renders_are_refused_in_one_line(extra, line):
    with pytest.raises(SpecError) as refused:
        validate_spec(normalize_spec({**SPEC, **extra}), [])
    assert str(refused.value) == line


def test_a_chunked_render_is_longer_than_one_generation_may_be():
    plan = validate_spec(normalize_spec({**SPEC, "frames": 8 * 80 + 1, "chunk_pixel_frames": 97,
                                         "chunk_carry_frames": 25}), [])
    assert plan.as_dict()["chunked"] is True and plan.frames == 641 and plan.decode_tiles == "off"
    with pytest.raises(SpecError, match="exceed the model's"):
        validate_spec(normalize_spec({**SPEC, "frames": 641, "chunked": None, "chunk_pixel_frames": None,
                                      "chunk_carry_frames": None}), [])
    assert "chunked" not in validate_spec(normalize_spec({"prompt": "a fox", "frames": 25}), []).as_dict()


GUIDED = {"two-stage": {"pipeline": "two-stage", "stage1_steps": 2, "stage2_steps": 1, "stg_blocks": [1]},
          "one-stage": {"pipeline": "one-stage", "steps": 2, "stg_blocks": [1]},
          "two-stage-hq": {"pipeline": "two-stage-hq", "stage1_steps": 2, "stage2_steps": 1}}


@pytest.mark.parametrize("pipeline", list(GUIDED))
@pytest.mark.parametrize("carry", ["decoded", "latent"])
def test_guided_windows_run_the_guided_stage_pinned_on_the_window_before(pipeline, carry):
    """Each window is the guided recipe's graph at its length (its passes read one negative text task), and
    each window after the first carries the one before's frames (or latents) into its guided stage's prep
    (replace at latent 0) and its audio into the prep's audio pin; a one-stage window pins at full size only."""
    tasks = _tasks(**GUIDED[pipeline], chunk_carry=carry)
    two = pipeline != "one-stage"
    assert [tid for tid, t in tasks.items() if t["kind"] == "text_encode"] == ["r.text", "r.negative"]
    assert not [t for t in tasks.values() if t["kind"] == "denoise_stage1"]
    for k in range(3):
        prep = tasks[f"r.w{k}.stage1.prep"]
        assert prep["params"]["frames"] == 17 and prep["params"]["seed"] == 3 + k
        assert prep["params"]["height"] == (32 if two else 64)
        uncond = tasks[f"r.w{k}.stage1.{'s0a' if pipeline == 'two-stage-hq' else 's0'}.uncond"]
        assert uncond["inputs"]["video_context"] == {"task": "r.negative", "output": "video_context"}
        if k == 0:
            assert prep["params"]["images"] == [] and "audio_pin" not in prep["inputs"]
            continue
        pinned = {"input": "context", "frame": 0, "strength": 1.0, "binding": "replace"}
        assert prep["params"]["images"] == [pinned] and prep["params"]["audio_pin_start"] == 0
        assert prep["inputs"]["audio_pin"] == {"task": f"r.w{k}.audio_pin", "output": "latent"}
        source = ("r.w%d.carry_s1" if two else "r.w%d.carry_s2") if carry == "latent" else (
            "r.w%d.context_s1" if two else "r.w%d.context_s2")
        assert prep["inputs"]["context"]["task"] == source % k
        if carry == "latent":
            cut = tasks[source % k]
            assert cut["inputs"]["latent"] == {"task": f"r.w{k - 1}.stage1", "output": "video_latent"}
        else:
            assert (f"r.w{k}.context_s1" in tasks) == two
        if two:
            stage2 = tasks[f"r.w{k}.stage2"] if pipeline == "two-stage" else tasks[f"r.w{k}.stage2.prep"]
            assert stage2["params"]["images"] == [pinned]
            assert stage2["inputs"]["context"]["task"] == (f"r.w{k}.carry_s2" if carry == "latent"
                                                           else f"r.w{k}.context_s2")
    final = "stage2" if two else "stage1"
    assert tasks["r.w2.decode"]["inputs"]["latent"] == {"task": f"r.w2.{final}", "output": "video_latent"}
    assert tasks["r.audio_join"]["inputs"]["w1"] == {"task": "r.w1.stage1", "output": "audio_latent"}


def test_a_guided_two_stage_windows_stage2_is_the_dev_one():
    tasks = _tasks(**GUIDED["two-stage"])
    for k in range(3):
        params = tasks[f"r.w{k}.stage2"]["params"]
        assert params["distilled_lora_strength"] == 1.0 and params["sampler"] == "euler" and params["renoise_audio"]


def test_a_keyframe_goes_to_the_first_window_that_makes_its_frame_at_its_window_local_index():
    lay = ChunkLayout(33, 17, 9)  # windows [0, 17), [8, 25), [16, 33)
    assert [lay.place(f) for f in (0, 8, 16, 17, 24, 25, 32)] == [(0, 0), (0, 8), (0, 16), (1, 9), (1, 16),
                                                                   (2, 9), (2, 16)]
    with pytest.raises(ChunkError, match="outside the clip's 0..32"):
        lay.place(33)
    for f in range(33):  # never in the carried prefix of the window it goes to
        k, local = lay.place(f)
        assert k == 0 or local >= lay.windows[k].carry


def test_keyframes_are_encoded_once_and_conditioned_in_their_own_windows():
    images = [{"blob": "0" * 64, "frame": 0}, {"blob": "1" * 64, "frame": 24, "strength": 0.5},
              {"blob": "2" * 64, "frame": -1, "binding": "guide"}]
    tasks = _tasks(images=images)
    assert [tid for tid, t in tasks.items() if t["kind"] == "image_encode"] == [
        "r.image1_s1", "r.image1_s2", "r.image2_s1", "r.image2_s2", "r.image3_s1", "r.image3_s2"]
    seen = {k: [im for im in tasks[f"r.w{k}.stage1"]["params"]["images"] if im["input"] != "context"]
            for k in range(3)}
    assert seen == {0: [{"frame": 0, "strength": 1.0, "binding": "replace", "input": "image1_latent"}],
                    1: [{"frame": 16, "strength": 0.5, "binding": "guide", "input": "image2_latent"}],
                    2: [{"frame": 16, "strength": 1.0, "binding": "guide", "input": "image3_latent"}]}
    assert tasks["r.w1.stage1"]["inputs"]["image2_latent"] == {"task": "r.image2_s1", "output": "latent"}
    assert tasks["r.w1.stage2"]["inputs"]["image2_latent"] == {"task": "r.image2_s2", "output": "latent"}
    assert "image1_latent" not in tasks["r.w1.stage1"]["inputs"]
    one = _tasks(**GUIDED["one-stage"], images=images[1:2])  # one stage at full size: the full-size encode alone
    assert [tid for tid, t in one.items() if t["kind"] == "image_encode"] == ["r.image1_s2"]
    assert one["r.w1.stage1.prep"]["inputs"]["image1_latent"] == {"task": "r.image1_s2", "output": "latent"}


def test_upstream_of_is_what_a_task_waits_on_and_mark_lead_marks_only_that():
    tasks = [{"id": i, "deps": d} for i, d in (("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"]), ("e", ["a"]))]
    assert upstream_of(tasks, {"d"}) == {"a", "b", "c", "d"} and upstream_of(tasks, {"zz"}) == set()
    assert [t.get("lead", False) for t in mark_lead(tasks, {"d"})] == [True, True, True, True, False]


@pytest.mark.parametrize("carry", ["decoded", "latent"])
def test_the_chain_of_windows_leases_first_and_a_steps_tiles_are_marked_alike(carry):
    """Each later window's stage 1 and what it waits on are `lead`: with the decoded carry the window before's
    stages, tiles and decode; with the latent carry its stage 1 alone, so its stage-2 tiles fill other Macs."""
    tasks = _tasks(chunk_carry=carry, stage2_tiles="1x2", tile_overlap=1)
    lead = {tid for tid, t in tasks.items() if t.get("lead")}
    assert {"r.text", "r.w0.stage1", "r.w1.stage1", "r.w2.stage1"} <= lead
    tiles = [tid for tid in tasks if tid.startswith("r.w0.stage2.")]
    assert tiles and {tid in lead for tid in tiles} == {carry == "decoded"}
    assert "r.w2.stage2" not in lead and "r.audio_join" not in lead  # after the last window's stage 1: no chain
    full = "r.w%d.carry_s2" if carry == "latent" else "r.w%d.context_s2"  # what a window's stage 2 pins
    assert (full % 1 in lead) == (carry == "decoded") and full % 2 not in lead  # w1's stage 2 feeds w2's carry
    assert not any(t.get("lead") for t in plan_render(validate_spec(normalize_spec(
        {**SPEC, "chunked": None, "chunk_pixel_frames": None, "chunk_carry_frames": None, "frames": 17}), []), "r"))
