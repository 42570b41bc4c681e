"""The media pipelines' pure math with numbers: retake windows, extend layouts, IC-LoRA control sizes,
metadata and attention masks, Dub-It's reference audio positions; and each refusal's one line."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from ltx_engine.models.patchify import video_positions
from ltx_engine.rules import dubit, extend, ic_lora, retake

pytestmark = pytest.mark.timeout(20)


def test_time_bounds_of_video_and_audio_tokens():
    np.testing.assert_allclose(
        retake.video_time_bounds((3, 1, 1), 24.0),
        [[0, 1 / 24], [1 / 24, 9 / 24], [9 / 24, 17 / 24]],
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        retake.audio_time_bounds(3), [[0, 0.01], [0.01, 0.05], [0.05, 0.09]], rtol=1e-6
    )


def test_retake_windows_in_latent_frames():
    assert retake.window_latent_frames(25, 24.0, 0.4, 0.6) == [2]
    assert retake.window_latent_frames(25, 24.0, 0.0, 0.01) == [0]
    assert retake.window_latent_frames(25, 24.0, 0.3, 0.4) == [1, 2]
    assert retake.window_latent_frames(97, 24.0, 1.0, 2.0) == [3, 4, 5, 6]  # pixels [17, 25) .. [41, 49)
    assert not retake.audio_window_mask(
        26, *retake.RetakeWindow(0.4, 0.6, regen_audio=False).audio_window
    ).any()
    assert retake.audio_window_mask(26, 0.4, 0.6)[0, :, 0].nonzero()[0].tolist() == list(range(10, 16))


@pytest.mark.parametrize(
    "start,end,line",
    [
        (0.6, 0.4, "--start 0.6 must be >= 0 and below --end 0.4"),
        (-1.0, 0.5, "--start -1.0 must be >= 0"),
        (0.2, 1.5, "--end 1.5 is past the source's 1.042 s"),
        (float("nan"), 0.5, "not finite"),
    ],
)
def test_retake_window_refusals(start, end, line):
    with pytest.raises(retake.RetakeError, match=line):
        retake.RetakeWindow(start, end).check(25 / 24)


def test_extend_layout_after_and_before():
    after = extend.ExtendLayout(source_frames=25, fps=24.0, new_latent_frames=2)
    assert (after.window_frames, after.output_frames, after.context_pixels) == (41, 41, (0, 25))
    assert (after.context_latent_index, after.context_frame, after.context_audio, after.window_audio) == (
        0,
        0,
        26,
        43,
    )
    assert after.audio_pin_start == 0 and after.source_audio_slice(26) == slice(0, 26)
    before = extend.ExtendLayout(source_frames=49, fps=24.0, new_latent_frames=2, direction="before")
    assert (before.context_pixels, before.context_latent_index, before.context_frame) == ((0, 25), 2, 9)
    assert (before.audio_pin_start, before.output_frames, before.source_audio_slice(51)) == (
        17,
        65,
        slice(0, 26),
    )
    late = extend.ExtendLayout(source_frames=49, fps=24.0, new_latent_frames=1)
    assert late.context_pixels == (24, 49) and late.source_audio_slice(51) == slice(25, 51)


def test_extend_assembly_joins_source_and_new_latents():
    source = np.arange(7, dtype=np.float32).reshape(1, 1, 7, 1, 1)
    window = 100 + np.arange(6, dtype=np.float32).reshape(1, 1, 6, 1, 1)
    after = extend.ExtendLayout(49, 24.0, 2)
    assert extend.assemble_video(after, source, window)[0, 0, :, 0, 0].tolist() == [
        0,
        1,
        2,
        3,
        4,
        5,
        6,
        104,
        105,
    ]
    before = extend.ExtendLayout(49, 24.0, 2, "before")
    assert extend.assemble_video(before, source, window)[0, 0, :, 0, 0].tolist() == [
        100,
        101,
        0,
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    audio = extend.assemble_audio(
        after, np.zeros((1, 8, 51, 16), np.float32), np.ones((1, 8, 43, 16), np.float32)
    )
    assert audio.shape[2] == extend.audio_latents(65, 24.0) == 68 and audio[0, 0, 51:, 0].min() == 1


@pytest.mark.parametrize(
    "args,line",
    [
        ((25, 24.0, 1, "sideways"), "--direction 'sideways': one of after, before"),
        ((25, 24.0, 0), "--extend-frames 0: at least 1 latent frame"),
        ((17, 24.0, 1), "the source has 17 frames; extend needs 8k \\+ 1 frames, at least 25"),
    ],
)
def test_extend_refusals(args, line):
    with pytest.raises(extend.ExtendError, match=line):
        extend.ExtendLayout(*args)


def test_control_sizes_and_reference_positions():
    assert ic_lora.control_size(256, 384, 2) == (128, 192)
    with pytest.raises(ic_lora.ControlError, match="the stage's 256x384 must be divisible by the IC-LoRA's"):
        ic_lora.control_size(256, 384, 5)
    with pytest.raises(ic_lora.ControlError, match="attention strength 1.5 must be in \\[0, 1\\]"):
        ic_lora.ControlReference(np.zeros((1, 8, 1, 1, 1)), attention_strength=1.5)
    want = np.array(video_positions(1, 3, 2, 2, 24.0), np.float32)
    want[:, 1:] *= 2
    np.testing.assert_array_equal(ic_lora.reference_positions((3, 2, 2), 24.0, 2), want)


def _lora_file(path, metadata):
    mx.save_safetensors(str(path), {"x": mx.zeros((1,))}, metadata=metadata)
    return str(path)


def test_control_downscale_from_metadata(tmp_path):
    two = _lora_file(tmp_path / "two.safetensors", {"reference_downscale_factor": "2"})
    one = _lora_file(tmp_path / "one.safetensors", {"reference_downscale_factor": "1"})
    four = _lora_file(tmp_path / "four.safetensors", {"reference_downscale_factor": "4"})
    bare = _lora_file(tmp_path / "bare.safetensors", {"format": "mlx"})
    assert ic_lora.control_downscale([one, two]) == 2 and ic_lora.control_downscale([one]) == 1
    with pytest.raises(
        ic_lora.ControlError, match="bare.safetensors: an IC-LoRA without a reference_downscale_factor"
    ):
        ic_lora.control_downscale([bare])
    with pytest.raises(
        ic_lora.ControlError, match="four.safetensors: reference_downscale_factor 4 conflicts"
    ):
        ic_lora.control_downscale([two, four])


def test_attention_mask_blocks():
    assert ic_lora.update_attention_mask(None, None, 4, 6, 2) is None
    mask = ic_lora.update_attention_mask(None, 0.5, 4, 6, 2)[0]
    assert mask.shape == (8, 8) and (mask[:6, :6] == 1).all() and (mask[6:, 6:] == 1).all()
    assert (mask[:4, 6:] == 0.5).all() and (mask[6:, :4] == 0.5).all() and (mask[4:6, 6:] == 0).all()
    grown = ic_lora.update_attention_mask(mask[None], None, 4, 8, 3)[0]
    assert grown.shape == (11, 11) and (grown[:8, :8] == mask).all() and (grown[:4, 8:] == 1).all()
    assert (grown[4:8, 8:] == 0).all()


def test_dubit_reference_audio_sits_before_time_zero():
    pos = dubit.reference_audio_positions(3)
    np.testing.assert_allclose(pos[0, 0], [[-0.13, -0.12], [-0.12, -0.08], [-0.08, -0.04]], rtol=1e-5)


def test_paths_without_an_attention_mask_refuse_a_partial_strength():
    from ltx_engine.denoise import StageInputs
    from ltx_engine.media_stage import refuse_unmasked

    control = ic_lora.ControlReference(np.zeros((1, 8, 1, 1, 1), np.float32), attention_strength=0.5)
    inputs = StageInputs(
        frames=9, height=64, width=64, fps=24.0, seed=0, sigmas=[1.0, 0.0], contexts={}, control=control
    )
    with pytest.raises(
        ValueError, match="prepared token arrays: an IC-LoRA control with attention strength below 1"
    ):
        refuse_unmasked(inputs, "a stage run as prepared token arrays")
    refuse_unmasked(StageInputs(**{**inputs.__dict__, "control": None}), "a stage run as prepared token arrays")


def test_stage_fields_from_task_params_and_inputs():
    from ltx_engine.media_stage import stage_fields

    latent, pin = np.zeros((1, 8, 2, 1, 1), np.float32), np.ones((1, 8, 3, 16), np.float32)
    params = {
        "retake": [0.4, 0.6, False],
        "audio_pin_start": 7,
        "control": {"strength": 0.9, "attention_strength": 0.5, "downscale": 2},
    }
    fields = stage_fields(params, {"audio_pin": pin, "control_latent": latent, "audio_reference": pin})
    assert fields["retake"] == retake.RetakeWindow(0.4, 0.6, False) and fields["audio_pin_start"] == 7
    control = fields["control"]
    assert (control.strength, control.attention_strength, control.downscale, control.cross()) == (
        0.9,
        0.5,
        2,
        0.5,
    )
    assert fields["audio_pin"] is pin and fields["audio_reference"] is pin
    assert stage_fields({}, {}) == {}
