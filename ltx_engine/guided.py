"""A guided step on the DiT: its forward passes (each one a farm task) and their combine.

`pass_x0` runs one pass (`guidance.COND`, `UNCOND`, `PERTURBED`, `ISOLATED`) and returns the
denoised x0 of both modalities (X0Model: `x - v * sigma * mask`); `guided_x0` runs every pass the
scales need and combines them per modality (`guidance.combine`), as ltx-pipelines'
`multi_modal_guider_denoising_func` does in one process. The farm runs the passes as separate tasks
and the coordinator calls `guidance.combine` on their outputs: the same functions, the same bits.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ltx_engine import guidance, sampling
from ltx_engine.denoise import state_modality
from ltx_engine.sampling import LatentState


def pass_x0(model, name: str, video: LatentState, audio: LatentState | None, sigma: float,
            contexts: dict[str, np.ndarray], negative: dict[str, np.ndarray] | None,
            video_params: guidance.GuiderParams,
            audio_params: guidance.GuiderParams | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """x0 of one guidance pass, float32 numpy; UNCOND reads the `negative` contexts."""
    if name == guidance.UNCOND:
        if negative is None:
            raise ValueError("the uncond pass needs the negative prompt's contexts")
        contexts = negative
    mask = contexts.get("context_mask")
    v_mod = state_modality(video, sigma, contexts["video_context"], mask)
    a_mod = None if audio is None else state_modality(audio, sigma, contexts["audio_context"], mask)
    perturbation = guidance.perturbation_for(name, video_params, audio_params)
    v_out, a_out = model(v_mod, a_mod, perturbation)
    mx.eval(v_out) if a_out is None else mx.eval(v_out, a_out)
    sig = float(sigma)
    x0_v = sampling.x0_from_velocity(video.latent, np.array(v_out.astype(mx.float32)),
                                     sampling.timesteps_from_mask(video.denoise_mask, sig))
    if a_out is None or audio is None:
        return x0_v, None
    x0_a = sampling.x0_from_velocity(audio.latent, np.array(a_out.astype(mx.float32)),
                                     sampling.timesteps_from_mask(audio.denoise_mask, sig))
    return x0_v, x0_a


def combine_passes(outputs: dict[str, tuple[np.ndarray, np.ndarray | None]], video_params: guidance.GuiderParams,
                   audio_params: guidance.GuiderParams | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-modality combine of {pass name: (x0 video, x0 audio)} (what the coordinator's step runs)."""
    x0_v = guidance.combine(video_params, {n: o[0] for n, o in outputs.items()})
    if audio_params is None or outputs[guidance.COND][1] is None:
        return x0_v, None
    return x0_v, guidance.combine(audio_params, {n: o[1] for n, o in outputs.items()})


def guided_x0(model, video: LatentState, audio: LatentState | None, sigma: float, contexts: dict[str, np.ndarray],
              negative: dict[str, np.ndarray] | None, video_params: guidance.GuiderParams,
              audio_params: guidance.GuiderParams | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Every pass the scales need, in `guidance.PASS_ORDER`, then their combine."""
    names = guidance.passes_needed(video_params, audio_params if audio is not None else None)
    outputs = {n: pass_x0(model, n, video, audio, sigma, contexts, negative, video_params, audio_params)
               for n in names}
    return combine_passes(outputs, video_params, audio_params)


def guided_euler_step(model, video: LatentState, audio: LatentState | None, sigmas: list[float], step: int,
                      contexts: dict[str, np.ndarray], negative: dict[str, np.ndarray] | None,
                      video_params: guidance.GuiderParams,
                      audio_params: guidance.GuiderParams | None = None) -> tuple[LatentState, LatentState | None]:
    """One guided Euler step of both states (clean tokens kept, as `sampling.denoise_step`)."""
    x0_v, x0_a = guided_x0(model, video, audio, float(sigmas[step]), contexts, negative, video_params, audio_params)
    video = sampling.denoise_step(video, x0_v, sigmas, step)
    if audio is not None and x0_a is not None:
        audio = sampling.denoise_step(audio, x0_a, sigmas, step)
    return video, audio


def _state(arrays: dict[str, np.ndarray], prefix: str) -> LatentState:
    return LatentState(latent=arrays[f"{prefix}latent"], denoise_mask=arrays[f"{prefix}mask"],
                       clean_latent=arrays[f"{prefix}clean"], positions=arrays[f"{prefix}positions"])


def run_pass(model, params: dict, arrays: dict[str, np.ndarray], contexts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A `guidance_pass` task: params {pass, sigma, video, audio (guider dicts)}; arrays the state
    (latent, mask, clean, positions, and audio_* when the render has audio); contexts the pass's own
    (the negative prompt's for the uncond pass). Outputs {x0, audio_x0}."""
    video = _state(arrays, "")
    audio = _state(arrays, "audio_") if "audio_latent" in arrays else None
    vp = guidance.params_from_dict(params["video"])
    ap = guidance.params_from_dict(params["audio"]) if params.get("audio") else None
    x0_v, x0_a = pass_x0(model, params["pass"], video, audio, float(params["sigma"]), contexts, contexts, vp, ap)
    return {"x0": x0_v} if x0_a is None else {"x0": x0_v, "audio_x0": x0_a}
