"""DFR's generated keyframe slots in a stage's state against the reference.

ltx-core 1.0.0 (the installed reference) has no `VideoGeneratedKeyframeSlots` and its GaussianNoiser
predates the lerp form, so `_reference_slots` below writes upstream's `apply_to` (ltx-core main,
conditioning/types/keyframe_slots.py: slot tokens from `initial_keyframes`, mask 1, clean 0, the
single-pixel-frame positions built from 1.0.0's own `get_pixel_coords`, the marker on the first
latent frame and the slots) and `_reference_noiser` upstream's GaussianNoiser
(components/noisers.py: lerp(clean, lerp(latent, noise, scale), mask)), both on 1.0.0's initial state.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

from ltx_core.components.patchifiers import VideoLatentPatchifier, VideoLatentShape, get_pixel_coords  # noqa: E402
from ltx_core.tools import VideoLatentTools  # noqa: E402

from ltx_engine.denoise import StageInputs, build_stage_states, stage_marker, stage_slots  # noqa: E402
from ltx_engine.rules import sampling  # noqa: E402

C, F, H, W, FPS = 8, 7, 2, 3, 24.0


def _reference_slots(tools: VideoLatentTools, state, frames: list[int], initials: torch.Tensor):
    """upstream VideoGeneratedKeyframeSlots.apply_to (and _slot_positions), on a 1.0.0 state."""
    frame_shape = tools.target_shape._replace(frames=1)
    coords = tools.patchifier.get_patch_grid_bounds(output_shape=frame_shape, device="cpu")
    positions = []
    for frame in frames:
        pos = get_pixel_coords(latent_coords=coords, scale_factors=tools.scale_factors, causal_fix=False).float()
        pos[:, 0, ...] = float(frame)
        pos[:, 0, ..., 1:] = pos[:, 0, ..., :1] + 1
        pos[:, 0, ...] /= tools.fps
        positions.append(pos)
    slot_tokens = torch.cat([tools.patchifier.patchify(initials[:, :, k : k + 1]) for k in range(len(frames))], 1)
    n = slot_tokens.shape[1]
    marker = torch.zeros_like(state.denoise_mask)
    marker[:, : H * W] = 1.0  # upstream's create_initial_state marks the first latent frame
    return (torch.cat([state.latent, slot_tokens], 1), torch.cat([state.denoise_mask, torch.ones(1, n, 1)], 1),
            torch.cat([state.positions, *positions], 2), torch.cat([state.clean_latent, torch.zeros_like(slot_tokens)], 1),
            torch.cat([marker, torch.ones(1, n, 1)], 1))


def _reference_noiser(latent, clean, mask, noise, scale):
    """upstream GaussianNoiser.__call__."""
    out = torch.lerp(latent.float(), noise.float(), scale)
    return torch.lerp(clean.float(), out, mask)


@pytest.mark.parametrize("stage2", [False, True])
def test_slot_state_matches_reference(stage2):
    rng = np.random.default_rng(3)
    frames = [24, 48]
    initial = rng.standard_normal((1, C, F, H, W)).astype(np.float32) if stage2 else None
    slot_latent = rng.standard_normal((1, C, 2, H, W)).astype(np.float32) if stage2 else None
    sigmas = [0.909375, 0.725, 0.421875, 0.0] if stage2 else list(sampling.DISTILLED_SIGMAS)
    inputs = StageInputs(frames=(F - 1) * 8 + 1, height=H * 32, width=W * 32, fps=FPS, seed=11, sigmas=sigmas,
                         contexts={}, audio_frames=4, initial_video=initial, slots=tuple(frames),
                         slot_latent=slot_latent)
    video, _ = build_stage_states(inputs, C)

    tools = VideoLatentTools(VideoLatentPatchifier(1), VideoLatentShape(1, C, F, H, W), fps=FPS)
    state = tools.create_initial_state("cpu", torch.float32, None if initial is None else torch.from_numpy(initial))
    seeds = torch.zeros(1, C, 2, H, W) if slot_latent is None else torch.from_numpy(slot_latent)
    latent, mask, positions, clean, marker = _reference_slots(tools, state, frames, seeds)
    noise = sampling.noise(video.latent.shape, 11, sampling.stream_id(sampling.STREAM_VIDEO, 0))
    noised = _reference_noiser(latent, clean, mask, torch.from_numpy(noise), sigmas[0]).numpy()

    np.testing.assert_array_equal(video.denoise_mask, mask.numpy())
    np.testing.assert_array_equal(video.clean_latent, clean.numpy())
    np.testing.assert_allclose(video.positions, positions.numpy(), rtol=1e-7, atol=0)
    np.testing.assert_array_equal(stage_marker(inputs, video.num_tokens), marker.numpy())
    rel = np.linalg.norm(video.latent - noised) / np.linalg.norm(noised)
    print("keyframe slots stage2" if stage2 else "keyframe slots stage1", "rel L2", rel)
    assert rel <= 1e-6
    np.testing.assert_array_equal(stage_slots(inputs, video), video.latent[:, -2 * H * W :].reshape(1, 2, H, W, C)
                                  .transpose(0, 4, 1, 2, 3))


def test_reference_tokens_follow_the_slots_as_the_reference_appends_them():
    """DFR's detailing stage 2: the IC-LoRA reference (stage 1's half-res video, downscale 2) appended
    after the slots; its tokens against ltx-core 1.0.0's VideoConditionByReferenceLatent, which is the
    reference for them (no temporal scale), and the slots still read out in front of it."""
    from ltx_core.conditioning.types import VideoConditionByReferenceLatent

    rng = np.random.default_rng(5)
    initial = rng.standard_normal((1, C, F, H, W)).astype(np.float32)
    reference = rng.standard_normal((1, C, F, 1, 2)).astype(np.float32)
    inputs = StageInputs(frames=(F - 1) * 8 + 1, height=H * 32, width=W * 32, fps=FPS, seed=11,
                         sigmas=[0.909375, 0.725, 0.421875, 0.0], contexts={}, audio_frames=4, initial_video=initial,
                         slots=(24, 48), slot_latent=rng.standard_normal((1, C, 2, H, W)).astype(np.float32),
                         reference_latent=reference, reference_downscale=2)
    video, _ = build_stage_states(inputs, C)
    tools = VideoLatentTools(VideoLatentPatchifier(1), VideoLatentShape(1, C, F, H, W), fps=FPS)
    state = tools.create_initial_state("cpu", torch.float32, torch.from_numpy(initial))
    ref = VideoConditionByReferenceLatent(torch.from_numpy(reference), downscale_factor=2).apply_to(state, tools)
    n_ref, n = reference[0, 0].size, F * H * W
    np.testing.assert_array_equal(video.clean_latent[:, -n_ref:], ref.clean_latent[:, n:].numpy())
    np.testing.assert_array_equal(video.denoise_mask[:, -n_ref:], ref.denoise_mask[:, n:].numpy())
    np.testing.assert_allclose(video.positions[:, :, -n_ref:], ref.positions[:, :, n:].numpy(), rtol=1e-7, atol=0)
    np.testing.assert_array_equal(video.latent[:, -n_ref:], video.clean_latent[:, -n_ref:])  # mask 0: kept clean
    marker = stage_marker(inputs, video.num_tokens)
    assert not marker[:, -n_ref:].any() and marker[:, n : n + 2 * H * W].all()
    np.testing.assert_array_equal(stage_slots(inputs, video), video.latent[:, n : n + 2 * H * W]
                                  .reshape(1, 2, H, W, C).transpose(0, 4, 1, 2, 3))
