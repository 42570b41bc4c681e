"""Retake's temporal region mask and IC-LoRA's reference conditioning against ltx-core 1.0.0, float32.

- the window masks (video and audio) == `TemporalRegionMask` (ltx-pipelines 1.0.0, its rule written in
  `upstream_rules.temporal_region_mask` on 1.0.0's patchifiers) over windows that start / end inside,
  on and between latent frames, and the empty window of `--no-regen-audio`;
- the control reference (latent, clean, mask, positions, attention mask) == `VideoConditionByReferenceLatent`
  (downscale 2, strength 0.8) wrapped in `ConditioningItemAttentionStrengthWrapper` (0.5), after a guide
  (`VideoConditionByKeyframeIndex`), on 1.0.0's initial state under 1.1.6's latent rule
  (`upstream_rules.conditioned_1_1_6`: appended tokens start as zeros); and at attention strength 1 no mask;
- the DiT's bias from that mask == 1.0.0's `_prepare_self_attention_mask`.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

from ltx_core.components.patchifiers import AudioPatchifier, VideoLatentPatchifier  # noqa: E402
from ltx_core.conditioning import (  # noqa: E402
    ConditioningItemAttentionStrengthWrapper,
    VideoConditionByKeyframeIndex,
    VideoConditionByReferenceLatent,
)
from ltx_core.model.transformer.transformer_args import TransformerArgsPreprocessor  # noqa: E402
from ltx_core.tools import AudioLatentTools, VideoLatentTools  # noqa: E402
from ltx_core.types import AudioLatentShape, VideoLatentShape  # noqa: E402

from ltx_engine.conditioning import ImageCondition, apply_image_conditions  # noqa: E402
from ltx_engine.models.patchify import video_positions  # noqa: E402
from ltx_engine.models.transformer import _self_attention_bias  # noqa: E402
from ltx_engine.rules import ic_lora, retake  # noqa: E402
from ltx_engine.rules.sampling import LatentState  # noqa: E402
from tests.parity.upstream_rules import (  # noqa: E402
    conditioned_1_1_6,
    gaussian_noiser_1_1_6,
    temporal_region_mask,
)

pytestmark = pytest.mark.timeout(30)
C, F, H, W, FPS = 8, 6, 2, 3, 24.0
WINDOWS = [(0.0, 0.01), (0.3, 0.7), (1 / 24, 9 / 24), (9 / 24, 17 / 24), (1.0, 1.75), (0.0, 0.0), (0.5, 5.0)]


def _close(got: np.ndarray, want: torch.Tensor) -> None:
    np.testing.assert_allclose(got, want.float().numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("start,end", WINDOWS)
def test_video_window_mask_equals_temporal_region_mask(start, end):
    tools = VideoLatentTools(VideoLatentPatchifier(1), VideoLatentShape(1, C, F, H, W), fps=FPS)
    state = tools.create_initial_state("cpu", torch.float32)
    want = temporal_region_mask(state, tools, start, end, FPS).denoise_mask
    np.testing.assert_array_equal(retake.video_window_mask((F, H, W), FPS, start, end), want.numpy())


@pytest.mark.parametrize("start,end", WINDOWS)
def test_audio_window_mask_equals_temporal_region_mask(start, end):
    frames = 44  # 1.76 s of audio latents
    tools = AudioLatentTools(AudioPatchifier(1), AudioLatentShape(1, C, frames, 16))
    state = tools.create_initial_state("cpu", torch.float32)
    want = temporal_region_mask(state, tools, start, end, FPS).denoise_mask
    np.testing.assert_array_equal(retake.audio_window_mask(frames, start, end), want.numpy())


def test_window_latent_frames_names_the_masked_frames():
    frames = (F - 1) * 8 + 1
    for start, end in WINDOWS:
        mask = retake.video_window_mask((F, 1, 1), FPS, start, end)[0, :, 0]
        assert retake.window_latent_frames(frames, FPS, start, end) == [k for k in range(F) if mask[k]]


def _upstream_control(ref: torch.Tensor, guide: torch.Tensor, attention: float | None):
    tools = VideoLatentTools(VideoLatentPatchifier(1), VideoLatentShape(1, C, F, H, W), fps=FPS)
    state = tools.create_initial_state("cpu", torch.float32)
    state = conditioned_1_1_6(VideoConditionByKeyframeIndex(keyframes=guide, frame_idx=9, strength=0.7), state, tools)
    cond = VideoConditionByReferenceLatent(latent=ref, downscale_factor=2, strength=0.8)
    if attention is not None:
        cond = ConditioningItemAttentionStrengthWrapper(cond, attention_mask=attention)
    return conditioned_1_1_6(cond, state, tools)


def _engine_control(ref: np.ndarray, guide: np.ndarray, attention: float):
    pos = np.array(video_positions(1, F, H, W, FPS), np.float32)
    video = LatentState.initial(np.zeros((1, F * H * W, C), np.float32), pos)
    video = apply_image_conditions(
        video, [ImageCondition(guide, 9, 0.7, "guide")], (F, H, W), (F - 1) * 8 + 1, FPS
    )
    control = ic_lora.ControlReference(ref, strength=0.8, attention_strength=attention, downscale=2)
    return ic_lora.append_control(video, None, control, FPS, F * H * W)


@pytest.mark.parametrize("attention", [0.5, 1.0])
def test_control_reference_equals_reference_latent_with_attention_strength(attention):
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((1, C, F, 1, 2)).astype(np.float32)  # half-size control, downscale 2
    guide = rng.standard_normal((1, C, 1, H, W)).astype(np.float32)
    want = _upstream_control(
        torch.from_numpy(ref), torch.from_numpy(guide), attention if attention < 1 else None
    )
    got, mask = _engine_control(ref, guide, attention)
    _close(got.latent, want.latent)
    _close(got.clean_latent, want.clean_latent)
    _close(got.denoise_mask, want.denoise_mask)
    # 1.0.0 positions a one-frame guide over [f, f + 8); the engine follows main's [f, f + 1) (see
    # test_image_conditions): the reference tokens' positions, the ones this test is about, are compared.
    n = F * H * W + H * W
    _close(got.positions[:, :, :n][:, 1:], want.positions[:, :, :n][:, 1:])
    _close(got.positions[:, :, n:], want.positions[:, :, n:])
    if attention >= 1.0:
        assert mask is None and want.attention_mask is None
        return
    _close(mask, want.attention_mask)
    assert mask[0, : F * H * W, n:].max() == np.float32(0.5) and mask[0, F * H * W : n, n:].max() == 0


def test_attention_bias_equals_prepare_self_attention_mask():
    rng = np.random.default_rng(4)
    mask = rng.choice(np.array([0.0, 0.25, 0.5, 1.0], np.float32), size=(1, 7, 7)).astype(np.float32)
    want = TransformerArgsPreprocessor._prepare_self_attention_mask(
        None, torch.from_numpy(mask), torch.float32
    )
    got = np.array(_self_attention_bias(mx.array(mask), mx.float32))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)


def test_control_conditioned_forward_of_the_tiny_dit_equals_1_0_0():
    """The reference-conditioning step whole: each side's own conditioned state (a control reference at
    attention strength 0.5 after the generated tokens) through the same seeded AV DiT, the mask read as
    1.0.0's self-attention bias; both velocities <= 1e-4 relative."""
    from ltx_core.model.transformer.modality import Modality as RefModality

    from ltx_engine.models.transformer import Modality
    from tests.parity.test_transformer import _audio_inputs, _cfg, _models, _rel

    ref_model, ours = _models(_cfg("split"), video_only=False)
    t = _cfg("split")["transformer"]
    f, h, w, c, sigma = 2, 2, 2, 128, 0.7
    rng = np.random.default_rng(8)
    control = rng.standard_normal((1, c, f, 1, 1)).astype(np.float32)
    tools = VideoLatentTools(VideoLatentPatchifier(1), VideoLatentShape(1, c, f, h, w), fps=FPS)
    noise = rng.standard_normal((1, f * h * w, c)).astype(np.float32)
    want = tools.create_initial_state("cpu", torch.float32, torch.from_numpy(noise.T.reshape(1, c, f, h, w)))
    cond = VideoConditionByReferenceLatent(latent=torch.from_numpy(control), downscale_factor=2, strength=1.0)
    want = conditioned_1_1_6(ConditioningItemAttentionStrengthWrapper(cond, attention_mask=0.5), want, tools)
    pos = np.array(video_positions(1, f, h, w, FPS), np.float32)
    got, mask = ic_lora.append_control(
        LatentState.initial(noise, pos),
        None,
        ic_lora.ControlReference(control, attention_strength=0.5, downscale=2),
        FPS,
        f * h * w,
    )
    fresh = rng.standard_normal(got.latent.shape).astype(np.float32)  # each side's noiser, same draw
    want, got = gaussian_noiser_1_1_6(want, torch.from_numpy(fresh), sigma), got.noised(fresh, sigma)
    ctx = rng.standard_normal((1, 7, t["cross_attention_dim"])).astype(np.float32)
    audio = {
        k: (v[:1] if isinstance(v, np.ndarray) else v)
        for k, v in _audio_inputs(rng, t["audio_cross_attention_dim"]).items()
    }
    with torch.no_grad():
        rv, ra = ref_model(
            RefModality(
                latent=want.latent,
                sigma=torch.tensor([sigma]),
                timesteps=(want.denoise_mask * sigma)[..., 0],
                positions=want.positions,
                context=torch.from_numpy(ctx),
                attention_mask=want.attention_mask,
            ),
            RefModality(
                **{k: (torch.from_numpy(np.asarray(v)) if v is not None else None) for k, v in audio.items()}
            ),
            None,
        )
    ov, oa = ours(
        Modality(
            latent=mx.array(got.latent),
            sigma=mx.array([sigma]),
            timesteps=mx.array((got.denoise_mask * sigma)[..., 0]),
            positions=mx.array(got.positions),
            context=mx.array(ctx),
            attention_mask=mx.array(mask),
        ),
        Modality(**{k: (mx.array(v) if v is not None else None) for k, v in audio.items()}),
    )
    errs = (_rel(np.array(ov), rv.numpy()), _rel(np.array(oa), ra.numpy()))
    print("control-conditioned forward", errs)
    assert max(errs) <= 1e-4
    unmasked, _ = ours(
        Modality(
            latent=mx.array(got.latent),
            sigma=mx.array([sigma]),
            timesteps=mx.array((got.denoise_mask * sigma)[..., 0]),
            positions=mx.array(got.positions),
            context=mx.array(ctx),
        ),
        Modality(**{k: (mx.array(v) if v is not None else None) for k, v in audio.items()}),
    )
    assert _rel(np.array(unmasked), rv.numpy()) > 1e-3  # the mask matters at this size


@pytest.mark.parametrize(
    "pixels,grid", [((17, 64, 96), (3, 2, 3)), ((9, 70, 45), (2, 3, 2)), ((1, 32, 32), (1, 1, 1))]
)
def test_latent_mask_equals_downsample_mask_to_latent(pixels, grid):
    from tests.parity.upstream_rules import downsample_mask_to_latent

    rng = np.random.default_rng(9)
    video = rng.uniform(-1, 1, (1, 3, *pixels)).astype(np.float32)
    mask = ic_lora.mask_from_pixels(video)
    want_mask = ((torch.from_numpy(video).mean(dim=1, keepdim=True) + 1.0) / 2.0).clamp(0.0, 1.0)
    _close(mask, want_mask)
    _close(ic_lora.latent_mask(mask, grid), downsample_mask_to_latent(want_mask, *grid))


def test_control_with_a_mask_video_equals_the_wrapper_with_a_tensor_mask():
    rng = np.random.default_rng(10)
    ref = rng.standard_normal((1, C, F, 1, 2)).astype(np.float32)
    per_token = rng.uniform(0, 1, (1, F * 2)).astype(np.float32)
    tools = VideoLatentTools(VideoLatentPatchifier(1), VideoLatentShape(1, C, F, H, W), fps=FPS)
    state = tools.create_initial_state("cpu", torch.float32)
    cond = VideoConditionByReferenceLatent(latent=torch.from_numpy(ref), downscale_factor=2, strength=1.0)
    want = ConditioningItemAttentionStrengthWrapper(cond, attention_mask=torch.from_numpy(per_token) * 0.8)
    want = want.apply_to(state, tools)
    pos = np.array(video_positions(1, F, H, W, FPS), np.float32)
    control = ic_lora.ControlReference(ref, attention_strength=0.8, downscale=2, attention_mask=per_token)
    got, mask = ic_lora.append_control(
        LatentState.initial(np.zeros((1, F * H * W, C), np.float32), pos), None, control, FPS, F * H * W
    )
    _close(mask, want.attention_mask)
    full = ic_lora.ControlReference(ref, attention_strength=1.0, downscale=2, attention_mask=per_token)
    assert full.cross() is not None  # a mask video always masks, even at strength 1 (upstream)


@pytest.mark.parametrize("frames,fps", [(25, 24.0), (97, 24.0), (121, 30.0), (49, 25.0), (33, 23.976)])
def test_retake_audio_length_equals_from_video_pixel_shape(frames, fps):
    from ltx_core.types import VideoPixelShape

    want = AudioLatentShape.from_video_pixel_shape(VideoPixelShape(1, frames, 64, 64, fps)).frames
    assert retake.audio_frames_for(frames, fps) == want
    source = np.ones((1, 8, 30, 16), np.float32)
    fitted = retake.fit_audio(source, want)
    assert (
        fitted.shape == (1, 8, want, 16)
        and fitted[:, :, 30:].sum() == 0
        and fitted[:, :, : min(30, want)].min() == 1
    )
