"""Image conditioning below strength 1 in a stage that starts below sigma 1, float32.

Held against ltx-core 1.0.0's conditioning items and noiser with 1.1.6's rule applied to them
(`upstream_rules.conditioned_1_1_6`, `gaussian_noiser_1_1_6`, upstream commit f4b06fb): a replaced frame
keeps the stage's latent, an appended one starts from zeros, the noiser lerps twice. Each case is
noised at distilled stage 2's first sigma (0.909375), where the 1.1.6 rule and 1.0.0's differ; the
test also checks that 1.0.0's rule misses there below strength 1, so the case tells the two apart.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

from ltx_core.components.patchifiers import VideoLatentPatchifier, VideoLatentShape  # noqa: E402
from ltx_core.conditioning.types import (  # noqa: E402
    ConditioningItemAttentionStrengthWrapper,
    VideoConditionByKeyframeIndex,
    VideoConditionByLatentIndex,
    VideoConditionByReferenceLatent,
)
from ltx_core.tools import VideoLatentTools  # noqa: E402

from ltx_engine.conditioning import ImageCondition, apply_image_conditions  # noqa: E402
from ltx_engine.denoise import StageInputs, build_stage_states  # noqa: E402
from ltx_engine.models.patchify import video_positions  # noqa: E402
from ltx_engine.rules import ic_lora, sampling  # noqa: E402
from ltx_engine.rules.sampling import STAGE_2_DISTILLED_SIGMAS, LatentState  # noqa: E402
from ltx_engine.rules.tokens import patchify_video  # noqa: E402
from tests.parity.upstream_rules import conditioned_1_1_6, gaussian_noiser_1_1_6  # noqa: E402

pytestmark = pytest.mark.timeout(60)
C, F, H, W, FPS = 8, 3, 2, 3, 24.0
FRAMES = (F - 1) * 8 + 1
SIGMA = STAGE_2_DISTILLED_SIGMAS[0]
STRENGTHS = (1.0, 0.8, 0.6)


def _rel(got: np.ndarray, want: torch.Tensor) -> float:
    w = want.numpy().astype(np.float64)
    return float(np.abs(got.astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-12))


def _tools() -> VideoLatentTools:
    return VideoLatentTools(VideoLatentPatchifier(1), VideoLatentShape(1, C, F, H, W), fps=FPS)


def _stage_latent(seed: int = 1) -> np.ndarray:
    """The stage's own latent (stage 1's, upsampled), what the 1.1.6 rule keeps under a replace."""
    return np.random.default_rng(seed).standard_normal((1, C, F, H, W)).astype(np.float32)


def _ours(stage: np.ndarray) -> LatentState:
    return LatentState.initial(patchify_video(stage), np.array(video_positions(1, F, H, W, FPS), np.float32))


def _noised_both(ours: LatentState, ref, seed: int) -> tuple[LatentState, object, object]:
    """Each side's noiser with one draw; also 1.0.0's noiser on 1.0.0's conditioned state."""
    noise = np.random.default_rng(seed).standard_normal(ours.latent.shape).astype(np.float32)
    return ours.noised(noise, SIGMA), gaussian_noiser_1_1_6(ref, torch.from_numpy(noise), SIGMA), noise


def _assert_state(got: LatentState, want) -> float:
    errs = [_rel(got.latent, want.latent), _rel(got.clean_latent, want.clean_latent),
            _rel(got.denoise_mask, want.denoise_mask)]
    print("conditioning 1.1.6 max rel", errs)
    assert max(errs) <= 1e-5
    return errs[0]


def _old_rule_misses(item, ref0, tools, noise: np.ndarray, got: LatentState, strength: float) -> None:
    """1.0.0's item and noiser (image in the latent, noise by sigma x mask) from the same draw."""
    err = _rel(got.latent, noise_1_0_0(item.apply_to(ref0, tools), torch.from_numpy(noise)))
    assert (err > 1e-2) if strength < 1 else (err <= 1e-5), err


def noise_1_0_0(state, noise: torch.Tensor) -> torch.Tensor:
    """1.0.0's `GaussianNoiser` (components/noisers.py) with its draw given: noise*s + latent*(1 - s),
    s = sigma x mask (the installed class draws its own noise, so its formula is written here)."""
    scaled = state.denoise_mask * SIGMA
    return noise * scaled + state.latent * (1 - scaled)


@pytest.mark.parametrize("strength", STRENGTHS)
def test_replaced_frame_keeps_the_stage_latent(strength):
    stage, image = _stage_latent(1), _stage_latent(2)[:, :, :1]
    tools = _tools()
    ref0 = tools.create_initial_state("cpu", torch.float32, torch.from_numpy(stage))
    item = VideoConditionByLatentIndex(torch.from_numpy(image), strength, 0)
    ours = apply_image_conditions(_ours(stage), [ImageCondition(image, 0, strength, "replace")], (F, H, W), FRAMES, FPS)
    got, want, noise = _noised_both(ours, conditioned_1_1_6(item, ref0, tools), 3)
    _assert_state(got, want)
    _old_rule_misses(item, ref0, tools, noise, got, strength)


@pytest.mark.parametrize("strength", STRENGTHS)
def test_guide_frame_appends_zeros(strength):
    stage, image = _stage_latent(1), _stage_latent(4)[:, :, :1]
    tools = _tools()
    ref0 = tools.create_initial_state("cpu", torch.float32, torch.from_numpy(stage))
    item = VideoConditionByKeyframeIndex(torch.from_numpy(image), 16, strength)
    ours = apply_image_conditions(_ours(stage), [ImageCondition(image, 16, strength, "guide")], (F, H, W), FRAMES, FPS)
    got, want, noise = _noised_both(ours, conditioned_1_1_6(item, ref0, tools), 5)
    _assert_state(got, want)
    _old_rule_misses(item, ref0, tools, noise, got, strength)


@pytest.mark.parametrize("strength", STRENGTHS)
def test_reference_through_the_attention_strength_wrapper(strength):
    """The appended reference (IC-LoRA control) wrapped in the attention-strength wrapper (0.5): the
    same latent rule, and the attention mask 1.0.0 builds."""
    stage = _stage_latent(1)
    control = np.random.default_rng(6).standard_normal((1, C, F, 1, 2)).astype(np.float32)
    tools = _tools()
    ref0 = tools.create_initial_state("cpu", torch.float32, torch.from_numpy(stage))
    inner = VideoConditionByReferenceLatent(torch.from_numpy(control), downscale_factor=2, strength=strength)
    item = ConditioningItemAttentionStrengthWrapper(inner, attention_mask=0.5)
    ref = ic_lora.ControlReference(control, strength=strength, attention_strength=0.5, downscale=2)
    ours, mask = ic_lora.append_control(_ours(stage), None, ref, FPS, F * H * W)
    got, want, noise = _noised_both(ours, conditioned_1_1_6(item, ref0, tools), 7)
    _assert_state(got, want)
    assert _rel(mask, want.attention_mask) <= 1e-6
    _old_rule_misses(item, ref0, tools, noise, got, strength)


@pytest.mark.parametrize("strength", STRENGTHS)
def test_a_stage_2_built_with_a_replace_and_a_guide(strength):
    """`build_stage_states` of a stage starting at 0.909 from its own latent, a replace at frame 0 and
    a guide at the last frame: the noised state == 1.1.6's items and noiser on the same draw."""
    stage, first, last = _stage_latent(1), _stage_latent(8)[:, :, :1], _stage_latent(9)[:, :, :1]
    conds = (ImageCondition(first, 0, strength, "replace"), ImageCondition(last, "last", strength, "guide"))
    inputs = StageInputs(frames=FRAMES, height=H * 32, width=W * 32, fps=FPS, seed=3,
                         sigmas=list(STAGE_2_DISTILLED_SIGMAS), contexts={}, audio_frames=2,
                         initial_video=stage, images=conds, noise_stream=1)
    got, _ = build_stage_states(inputs, C)
    tools = _tools()
    ref = tools.create_initial_state("cpu", torch.float32, torch.from_numpy(stage))
    ref = conditioned_1_1_6(VideoConditionByLatentIndex(torch.from_numpy(first), strength, 0), ref, tools)
    ref = conditioned_1_1_6(VideoConditionByKeyframeIndex(torch.from_numpy(last), FRAMES - 1, strength), ref, tools)
    noise = sampling.noise(got.latent.shape, 3, sampling.stream_id(sampling.STREAM_VIDEO, 1))
    _assert_state(got, gaussian_noiser_1_1_6(ref, torch.from_numpy(noise), SIGMA))
