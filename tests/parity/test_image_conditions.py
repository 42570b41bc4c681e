"""Several images on a stage's state against ltx-core 1.0.0's conditioning items, float32.

- two `replace` images (frame 0 and frame -8, the last latent frame) == two
  `VideoConditionByLatentIndex` (latent_idx 0 and F - 1) on 1.0.0's initial state;
- two `guide` images (frame 17 and `last`) and a two-latent-frame guide == `VideoConditionByKeyframeIndex`.
  1.0.0 positions a one-frame keyframe over the VAE's 8 frames, [f, f + 8); upstream since
  `num_pixel_frames` (ltx-core main, conditioning/types/keyframe_cond.py) narrows a latent of one pixel
  frame to [f, f + 1): the test applies that formula to 1.0.0's positions (`_narrow`). The multi-frame
  guide keeps 1.0.0's positions as they are.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

from ltx_core.components.patchifiers import VideoLatentPatchifier, VideoLatentShape  # noqa: E402
from ltx_core.conditioning.types import VideoConditionByKeyframeIndex, VideoConditionByLatentIndex  # noqa: E402
from ltx_core.tools import VideoLatentTools  # noqa: E402

from ltx_engine.conditioning import ImageCondition, apply_image_conditions  # noqa: E402
from ltx_engine.denoise import StageInputs, build_stage_states  # noqa: E402
from ltx_engine.models.patchify import video_positions  # noqa: E402
from ltx_engine.rules.sampling import LatentState  # noqa: E402
from ltx_engine.rules.tokens import patchify_video  # noqa: E402
from tests.parity.upstream_rules import conditioned_1_1_6  # noqa: E402

pytestmark = pytest.mark.timeout(20)
C, F, H, W, FPS = 8, 4, 2, 3, 24.0
FRAMES = (F - 1) * 8 + 1


def _tools() -> VideoLatentTools:
    return VideoLatentTools(VideoLatentPatchifier(1), VideoLatentShape(1, C, F, H, W), fps=FPS)


def _latents(n: int, frames: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.standard_normal((1, C, frames, H, W)).astype(np.float32) for _ in range(n)]


def _ours_initial(clean: np.ndarray) -> LatentState:
    return LatentState.initial(patchify_video(clean), np.array(video_positions(1, F, H, W, FPS), np.float32))


def _narrow(positions: torch.Tensor, n: int) -> torch.Tensor:
    """upstream's num_pixel_frames == 1 rule on the last n tokens: time end = start + 1 frame."""
    out = positions.clone()
    out[:, 0, -n:, 1] = out[:, 0, -n:, 0] + 1.0 / FPS
    return out


def _assert_same(ours: LatentState, ref) -> None:
    np.testing.assert_array_equal(ours.latent, ref.latent.numpy())
    np.testing.assert_array_equal(ours.clean_latent, ref.clean_latent.numpy())
    # 1 - strength in float32 (the engine's rule) vs in double then cast: one float32 ULP apart at most
    np.testing.assert_allclose(ours.denoise_mask, ref.denoise_mask.numpy(), rtol=1e-6, atol=0)
    rel = np.abs(ours.positions - ref.positions.numpy()).max() / np.abs(ref.positions.numpy()).max()
    print("image conditions positions max rel", rel)
    assert rel <= 1e-6


def test_two_replace_images_match_latent_index_conditioning():
    clean = np.random.default_rng(1).standard_normal((1, C, F, H, W)).astype(np.float32)
    first, last = _latents(2)
    tools = _tools()
    ref = tools.create_initial_state("cpu", torch.float32, torch.from_numpy(clean))
    ref = conditioned_1_1_6(VideoConditionByLatentIndex(torch.from_numpy(first), 0.9, 0), ref, tools)
    ref = conditioned_1_1_6(VideoConditionByLatentIndex(torch.from_numpy(last), 1.0, F - 1), ref, tools)
    conds = (ImageCondition(first, 0, 0.9, "replace", "first"), ImageCondition(last, -8, 1.0, "replace", "last"))
    _assert_same(apply_image_conditions(_ours_initial(clean), conds, (F, H, W), FRAMES, FPS), ref)


def test_two_guide_images_match_keyframe_index_conditioning():
    clean = np.zeros((1, C, F, H, W), np.float32)
    mid, end = _latents(2)
    clip = _latents(1, frames=2)[0]
    tools = _tools()
    ref = tools.create_initial_state("cpu", torch.float32, None)
    ref = conditioned_1_1_6(VideoConditionByKeyframeIndex(torch.from_numpy(mid), 17, 0.7), ref, tools)
    ref = dataclasses.replace(ref, positions=_narrow(ref.positions, H * W))
    ref = conditioned_1_1_6(VideoConditionByKeyframeIndex(torch.from_numpy(end), FRAMES - 1, 1.0), ref, tools)
    ref = dataclasses.replace(ref, positions=_narrow(ref.positions, H * W))
    ref = conditioned_1_1_6(VideoConditionByKeyframeIndex(torch.from_numpy(clip), 9, 0.5), ref, tools)  # 9 frames
    conds = (ImageCondition(mid, 17, 0.7, "guide"), ImageCondition(end, "last", 1.0, "guide"),
             ImageCondition(clip, 9, 0.5, "guide", "clip"))
    _assert_same(apply_image_conditions(_ours_initial(clean), conds, (F, H, W), FRAMES, FPS), ref)


def test_a_stage_with_first_and_last_images_builds_on_both():
    """Through `build_stage_states`: `images` (replace at 0, guide at `last`) equal the conditions
    applied by hand before noising; the single-image fields are untouched."""
    first, end = _latents(2)
    conds = (ImageCondition(first, 0, 1.0, "auto"), ImageCondition(end, "last", 0.8, "auto"))
    inputs = StageInputs(frames=FRAMES, height=H * 32, width=W * 32, fps=FPS, seed=3, sigmas=[1.0, 0.5, 0.0],
                         contexts={}, audio_frames=2, images=conds)
    video, _ = build_stage_states(inputs, C)
    want = apply_image_conditions(_ours_initial(np.zeros((1, C, F, H, W), np.float32)), conds, (F, H, W), FRAMES, FPS)
    assert video.num_tokens == F * H * W + H * W
    np.testing.assert_array_equal(video.clean_latent, want.clean_latent)
    np.testing.assert_array_equal(video.denoise_mask, want.denoise_mask)
    np.testing.assert_array_equal(video.positions, want.positions)
