"""ltx-pipelines 1.0.0 pieces the parity tests need but the venv lacks (only ltx-core is installed).

Written from reading ltx-pipelines 1.0.0 (`utils/res2s.py`, `utils/samplers.py`
`res2s_audio_video_denoising_loop` in legacy mode with bongmath, `utils/helpers.post_process_latent`,
`multi_modal_guider_denoising_func`), in torch, around ltx-core 1.0.0's own `Res2sDiffusionStep`,
`MultiModalGuider` and perturbation classes, which are imported, not rewritten. One modality's state.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from ltx_core.components.diffusion_steps import Res2sDiffusionStep
from ltx_core.guidance.perturbations import (
    BatchedPerturbationConfig,
    Perturbation,
    PerturbationConfig,
    PerturbationType,
)


def phi(j: int, neg_h: float) -> float:
    if abs(neg_h) < 1e-10:
        return 1.0 / math.factorial(j)
    return (math.exp(neg_h) - sum(neg_h**k / math.factorial(k) for k in range(j))) / (neg_h**j)


def res2s_coefficients(h: float, c2: float = 0.5) -> tuple[float, float, float]:
    a21 = c2 * phi(1, -h * c2)
    b2 = phi(2, -h) / c2
    return a21, phi(1, -h) - b2, b2


def post_process_latent(denoised: torch.Tensor, mask: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    return (denoised * mask + clean.float() * (1 - mask)).to(denoised.dtype)


def new_noise(raw: torch.Tensor) -> torch.Tensor:
    """`_get_new_noise` on a given float64 draw: standardise globally, then over the last two axes."""
    n = (raw - raw.mean()) / raw.std()
    return n.sub_(n.mean(dim=(-2, -1), keepdim=True)).div_(n.std(dim=(-2, -1), keepdim=True))


def res2s_loop(sigmas: torch.Tensor, latent: torch.Tensor, mask: torch.Tensor, clean: torch.Tensor,
               denoise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
               step_noise: list[torch.Tensor], sub_noise: list[torch.Tensor],
               model_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The loop on one state; `denoise(latent, sigma)` returns x0; noises are raw float64 draws per step."""
    stepper = Res2sDiffusionStep()
    n_full = len(sigmas) - 1
    if sigmas[-1] == 0:
        sigmas = torch.cat([sigmas[:-1], torch.tensor([0.0011, 0.0])], dim=0)
    hs = -torch.log(sigmas[1:].double() / sigmas[:-1].double())
    for i in range(n_full):
        sigma, sigma_next = sigmas[i].double(), sigmas[i + 1].double()
        anchor = latent.clone().double()
        d1 = post_process_latent(denoise(latent, sigma), mask, clean)
        h = hs[i].item()
        a21, b1, b2 = res2s_coefficients(h)
        sub_sigma = torch.sqrt(sigma * sigma_next)
        eps1 = d1.double() - anchor
        x_mid = anchor + h * a21 * eps1
        x_mid = stepper.step(sample=anchor, denoised_sample=x_mid, sigmas=torch.stack([sigma, sub_sigma]),
                             step_index=0, noise=new_noise(sub_noise[i]))
        x_mid = post_process_latent(x_mid, mask, clean)
        if h < 0.5 and sigma > 0.03:
            for _ in range(100):
                anchor = x_mid - h * a21 * eps1
                eps1 = d1.double() - anchor
        d2 = post_process_latent(denoise(x_mid.to(model_dtype), sub_sigma), mask, clean)
        eps2 = d2.double() - anchor
        x_next = anchor + h * (b1 * eps1 + b2 * eps2)
        x_next = stepper.step(sample=anchor, denoised_sample=x_next, sigmas=sigmas, step_index=i,
                              noise=new_noise(step_noise[i]))
        latent = post_process_latent(x_next, mask, clean).to(model_dtype)
    if sigmas[-1] == 0:
        latent = post_process_latent(denoise(latent, sigmas[n_full]), mask, clean).to(model_dtype)
    return latent


def stg_config(video_blocks: list[int] | None, audio_blocks: list[int] | None, batch: int) -> BatchedPerturbationConfig:
    """`multi_modal_guider_denoising_func`'s perturbed pass: self-attention skipped in the STG blocks."""
    ps = []
    if video_blocks is not None:
        ps.append(Perturbation(type=PerturbationType.SKIP_VIDEO_SELF_ATTN, blocks=video_blocks))
    if audio_blocks is not None:
        ps.append(Perturbation(type=PerturbationType.SKIP_AUDIO_SELF_ATTN, blocks=audio_blocks))
    return BatchedPerturbationConfig([PerturbationConfig(perturbations=ps) for _ in range(batch)])


def isolation_config(batch: int, blocks: list[int] | None = None) -> BatchedPerturbationConfig:
    """Its modality-isolated pass: both audio<->video cross-attentions skipped in every block (None, the
    pipelines' choice) or in `blocks` (ltx-core's `Perturbation.blocks`, the farm's --modality-blocks)."""
    ps = [Perturbation(type=PerturbationType.SKIP_A2V_CROSS_ATTN, blocks=blocks),
          Perturbation(type=PerturbationType.SKIP_V2A_CROSS_ATTN, blocks=blocks)]
    return BatchedPerturbationConfig([PerturbationConfig(perturbations=ps) for _ in range(batch)])
