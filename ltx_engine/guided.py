"""A guided step on the DiT: its forward passes (each one a farm task) and their combine.

`pass_x0` runs one pass (`guidance.COND`, `UNCOND`, `PERTURBED`, `ISOLATED`) and returns the
denoised x0 of both modalities (X0Model: `x - v * sigma * mask`); `guided_x0` runs every pass the
scales need and combines them per modality (`guidance.combine`), as ltx-pipelines'
`multi_modal_guider_denoising_func` does in one process. The farm runs the passes as separate tasks
and the coordinator calls `guidance.combine` on their outputs: the same functions, the same bits.
"""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import numpy as np

from ltx_engine.denoise import stream_modalities
from ltx_engine.rules import guidance, sampling
from ltx_engine.rules.sampling import LatentState
from ltx_engine.rules.tdp import first_frame_marker


def pass_x0(model, name: str, video: LatentState | None, audio: LatentState | None, sigma: float,
            contexts: dict[str, np.ndarray], negative: dict[str, np.ndarray] | None,
            video_params: guidance.GuiderParams, audio_params: guidance.GuiderParams | None = None,
            cache=None, frozen: str | None = None, marker: np.ndarray | None = None, split=None,
            ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """x0 of one guidance pass, float32 numpy; UNCOND reads the `negative` contexts. `video` None: the
    DiT runs the audio stream alone (T2A, upstream's `video=None`), and the video x0 is None. `cache`: the
    pass's step cache across its stage's rounds (`ltx_engine.step_cache`). `frozen` "video" / "audio": that
    stream's guider skips this step, so it runs disabled (upstream's `enabled=False`) and its x0 is None.
    `marker`: the video's (1, T, 1) LTX-2.5 keyframe marker (the state's, as upstream's passes read it).
    `split`: a `sp_denoise.Split`, the forward's video tokens split k ways (a gang's rank, or `--local`'s k
    shards), the same bits as unsplit; a pass without a video stream to split (T2A, a frozen video) and a
    cached one run whole on every rank."""
    if name == guidance.UNCOND:
        if negative is None:
            raise ValueError("the uncond pass needs the negative prompt's contexts")
        contexts = negative
    v_mod, a_mod = stream_modalities(video, audio, sigma, contexts)
    if marker is not None and v_mod is not None:
        v_mod.keyframes_mask = mx.array(marker)
    if frozen == "video":
        v_mod = replace(v_mod, enabled=False)
    elif frozen == "audio":
        a_mod = replace(a_mod, enabled=False)
    perturbation = guidance.perturbation_for(name, video_params, audio_params)
    if split is not None and split.degree > 1 and cache is None and v_mod is not None and v_mod.enabled:
        from ltx_engine.parallel.sequence_parallel import sp_forward

        v_out, a_out = sp_forward(model, v_mod, a_mod, split.exchange(video.num_tokens), perturbation)
    elif cache is None:
        v_out, a_out = model(v_mod, a_mod, perturbation)
    else:
        v_out, a_out = model(v_mod, a_mod, perturbation, cache)
    mx.eval(*(o for o in (v_out, a_out) if o is not None))
    sig = float(sigma)
    return _x0(video, v_out, sig), _x0(audio, a_out, sig)


def _x0(state: LatentState | None, velocity, sigma: float) -> np.ndarray | None:
    """One modality's x0 from its velocity (None when the modality is absent)."""
    if state is None or velocity is None:
        return None
    return sampling.x0_from_velocity(state.latent, np.array(velocity.astype(mx.float32)),
                                     sampling.timesteps_from_mask(state.denoise_mask, sigma))


def combine_passes(outputs: dict[str, tuple[np.ndarray | None, np.ndarray | None]],
                   video_params: guidance.GuiderParams, audio_params: guidance.GuiderParams | None = None,
                   ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Per-modality combine of {pass name: (x0 video, x0 audio)} (what the coordinator's step runs); a
    modality the passes did not run (T2A's video) combines to None."""
    cond_v = outputs[guidance.COND][0]
    x0_v = None if cond_v is None else guidance.combine(video_params, {n: o[0] for n, o in outputs.items()})
    if audio_params is None or outputs[guidance.COND][1] is None:
        return x0_v, None
    return x0_v, guidance.combine(audio_params, {n: o[1] for n, o in outputs.items()})


def guided_x0(model, video: LatentState | None, audio: LatentState | None, sigma: float,
              contexts: dict[str, np.ndarray], negative: dict[str, np.ndarray] | None,
              video_params: guidance.GuiderParams, audio_params: guidance.GuiderParams | None = None,
              ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Every pass the scales need, in `guidance.PASS_ORDER`, then their combine."""
    names = guidance.passes_needed(video_params, audio_params if audio is not None else None)
    outputs = {n: pass_x0(model, n, video, audio, sigma, contexts, negative, video_params, audio_params)
               for n in names}
    return combine_passes(outputs, video_params, audio_params)


def guided_euler_step(model, video: LatentState | None, audio: LatentState | None, sigmas: list[float], step: int,
                      contexts: dict[str, np.ndarray], negative: dict[str, np.ndarray] | None,
                      video_params: guidance.GuiderParams, audio_params: guidance.GuiderParams | None = None,
                      ) -> tuple[LatentState | None, LatentState | None]:
    """One guided Euler step of both states (clean tokens kept, as `sampling.denoise_step`); video None: T2A."""
    x0_v, x0_a = guided_x0(model, video, audio, float(sigmas[step]), contexts, negative, video_params, audio_params)
    if video is not None:
        video = sampling.denoise_step(video, x0_v, sigmas, step)
    if audio is not None and x0_a is not None:
        audio = sampling.denoise_step(audio, x0_a, sigmas, step)
    return video, audio


def _state(arrays: dict[str, np.ndarray], prefix: str) -> LatentState:
    return LatentState(latent=arrays[f"{prefix}latent"], denoise_mask=arrays[f"{prefix}mask"],
                       clean_latent=arrays[f"{prefix}clean"], positions=arrays[f"{prefix}positions"])


def _marker(model, params: dict, video: LatentState | None) -> np.ndarray | None:
    """The pass's keyframe marker (first latent frame, the stage's slots) from the planner's `grid` and
    `slot_range`; None without one, or on a DiT without LTX-2.5's keyframe embedding (it ignores it)."""
    if video is None or not params.get("marker") or not model.config.use_keyframes_abs_pos_embedding:
        return None
    slots = params.get("slot_range")
    return first_frame_marker(tuple(params["grid"]), video.num_tokens, None if slots is None else tuple(slots))


def run_pass(model, params: dict, arrays: dict[str, np.ndarray], contexts: dict[str, np.ndarray],
             cache=None, split=None) -> dict[str, np.ndarray]:
    """A `guidance_pass` task: params {pass, sigma, video, audio (guider dicts)}; arrays the state
    (latent, mask, clean, positions when the render has video, and audio_* when it has audio); contexts
    the pass's own (the negative prompt's for the uncond pass). Outputs {x0, audio_x0}, each present
    with its modality, and the step cache's state for the pass's next round (`cache_*`) when it caches.
    `split`: the forward's sequence-parallel split (`pass_x0`)."""
    video = _state(arrays, "") if params.get("video") else None
    audio = _state(arrays, "audio_") if "audio_latent" in arrays else None
    vp = guidance.params_from_dict(params["video"]) if video is not None else guidance.GuiderParams()
    ap = guidance.params_from_dict(params["audio"]) if params.get("audio") else None
    x0_v, x0_a = pass_x0(model, params["pass"], video, audio, float(params["sigma"]), contexts, contexts, vp, ap, cache,
                         params.get("frozen"), _marker(model, params, video), split)
    out = {name: x0 for name, x0 in (("x0", x0_v), ("audio_x0", x0_a)) if x0 is not None}
    return out if cache is None else out | cache.to_arrays()
