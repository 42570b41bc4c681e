"""The coordinator's guided step: combine a step's guidance passes and advance the sampler. Pure numpy.

Like `tdp_step` blends a step's tiles, a `guide_step` task reads the x0 every pass of one evaluation
returned (`{pass}_x0`, `{pass}_audio_x0`), combines them per modality (`guidance.combine`, in
upstream's order, float32) and takes the sampler's step on the state (`latent`, `clean`, `mask`, and
`audio_*`). `params["evaluation"]` says which step: `euler` (one-stage / two-stage stage 1), the two
halves of a res_2s step (`mid`: the midpoint the second round of passes reads; `end`: the next
latent), or `final` (the x0 of a res_2s schedule's last evaluation at 0.0011). The engine's local
loop calls these same functions, so farm and local take the same bits.
"""

from __future__ import annotations

import numpy as np

from ltx_engine.rules import guidance, res2s, sampling
from ltx_engine.rules.sampling import LatentState
from ltx_engine.rules.tokens import slot_latent, unpatchify_audio, unpatchify_video

EVALUATIONS = ("euler", "mid", "end", "final")
_NOISE_STREAMS = {"": (res2s.STREAM_VIDEO_SUBSTEP, res2s.STREAM_VIDEO_STEP),
                  "audio_": (res2s.STREAM_AUDIO_SUBSTEP, res2s.STREAM_AUDIO_STEP)}


def _marks(params: dict, key: str, prefix: str) -> bool:
    """Whether `held` / `keep_x0` names this stream: True names every stream, a list the prefixes in it."""
    value = params.get(key)
    return value is True or (isinstance(value, list) and prefix in value)


def combined_x0(params: dict, inputs: dict[str, np.ndarray], prefix: str) -> np.ndarray:
    """One modality's guided x0 from the passes named in params["passes"]; a stream `held` this round (its
    skip step) reuses the previous round's x0, which that round's step kept (`keep_x0`), while the other
    stream's passes may run."""
    if _marks(params, "held", prefix):
        return inputs[f"held_{prefix}x0"]
    p = guidance.params_from_dict(params["audio" if prefix else "video"])
    return guidance.combine(p, {name: inputs[f"{name}_{prefix}x0"] for name in params["passes"]})


def _state(inputs: dict[str, np.ndarray], prefix: str) -> LatentState:
    latent = inputs[f"{prefix}latent"]
    return LatentState(latent=latent, denoise_mask=inputs[f"{prefix}mask"], clean_latent=inputs[f"{prefix}clean"],
                       positions=np.zeros((latent.shape[0], 1, latent.shape[1], 2), np.float32))


def sde_noise(params: dict, prefix: str, shape: tuple[int, ...], substep: bool) -> np.ndarray:
    """The res_2s SDE noise of one modality at this step (seeded per render, stream per modality/half)."""
    base = _NOISE_STREAMS[prefix][0 if substep else 1]
    index = int(params.get("stream_offset", 0)) + int(params["step"])  # stage 2's offset: streams of its own
    return res2s.sde_noise(shape, int(params["seed"]), sampling.stream_id(base, index))


def _modality_step(params: dict, inputs: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    x0 = combined_x0(params, inputs, prefix)
    kept = {f"{prefix}x0": x0} if _marks(params, "keep_x0", prefix) else {}
    return kept | _advance(params, inputs, prefix, x0)


def _advance(params: dict, inputs: dict[str, np.ndarray], prefix: str, x0: np.ndarray) -> dict[str, np.ndarray]:
    """The sampler's step of one modality from its guided x0."""
    state = _state(inputs, prefix)
    sigmas, step, evaluation = tuple(params["sigmas"]), int(params["step"]), params["evaluation"]
    if evaluation == "euler":
        return {f"{prefix}latent": sampling.denoise_step(state, x0, sigmas, step).latent}
    if evaluation == "final":
        return {f"{prefix}latent": sampling.apply_clean(x0, state.clean_latent, state.denoise_mask)}
    if evaluation == "mid":
        noise = sde_noise(params, prefix, state.latent.shape, substep=True)
        mid = res2s.res2s_midpoint(state.latent, x0, state.denoise_mask, state.clean_latent, sigmas, step, noise)
        return {f"{prefix}latent": mid.x_mid.astype(np.float32), f"{prefix}x_mid": mid.x_mid,
                f"{prefix}anchor": mid.anchor, f"{prefix}eps1": mid.eps1}
    if evaluation == "end":
        mid = midpoint_from(params, inputs, prefix)
        noise = sde_noise(params, prefix, state.latent.shape, substep=False)
        x_next = res2s.res2s_finish(mid, x0, state.denoise_mask, state.clean_latent, sigmas, step, noise)
        return {f"{prefix}latent": x_next}
    raise ValueError(f"unknown guided evaluation {evaluation!r} (one of {', '.join(EVALUATIONS)})")


def midpoint_from(params: dict, inputs: dict[str, np.ndarray], prefix: str) -> res2s.Midpoint:
    """The `mid` task's outputs read back as the midpoint `end` finishes from."""
    sigmas, step = tuple(params["sigmas"]), int(params["step"])
    sub = float(np.sqrt(np.float64(np.float32(sigmas[step])) * np.float64(np.float32(sigmas[step + 1]))))
    return res2s.Midpoint(x_mid=inputs[f"{prefix}x_mid"], anchor=inputs[f"{prefix}anchor"],
                          eps1=inputs[f"{prefix}eps1"], sub_sigma=sub, h=res2s.step_size(sigmas, step))


def guide_step(params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of a `guide_step` task (video, and audio when the state has it; T2A's state is audio alone)."""
    out = _modality_step(params, inputs, "") if params.get("video") else {}
    if "audio_latent" in inputs and params.get("audio"):
        out |= _modality_step(params, inputs, "audio_")
    finish = params.get("finish")
    if finish:  # the stage's last step: the latents as the next stages read them (generated tokens only)
        if "latent" in out:
            grid = tuple(int(n) for n in finish["grid"])
            out["video_latent"] = unpatchify_video(out["latent"][:, : int(np.prod(grid))], grid)
            if finish.get("slot_range"):  # the stage's generated keyframe slots, as an untiled stage gives them
                out["slots"] = slot_latent(out["latent"], finish["slot_range"], grid)
        if "audio_latent" in out:
            out["audio_latent"] = unpatchify_audio(out.pop("audio_latent"), int(finish["audio_channels"]))
    return {k: np.ascontiguousarray(v) for k, v in out.items()}
