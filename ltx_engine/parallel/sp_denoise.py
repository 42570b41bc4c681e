"""Stage 1 denoised with a sequence-parallel forward, step by step, resumable from a kept step.

The sampler step is the one of `ltx_engine.denoise` (numpy, replicated on every rank: each rank holds
the whole velocity after the forward's last gather). After each step the states can be handed to
`on_step` (the farm keeps them as blobs); `resume` starts the loop at a kept step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ltx_engine.denoise import (
    Forward,
    StageInputs,
    build_stage_states,
    stage_marker,
    step_states,
    stream_modalities,
)
from ltx_engine.media_stage import attention_mask, generated_audio
from ltx_engine.parallel.sequence_parallel import (
    Exchange,
    GroupExchange,
    LocalExchange,
    ShardPlan,
    sp_forward,
)
from ltx_engine.rules.sampling import LatentState
from ltx_engine.rules.tokens import unpatchify_audio, unpatchify_video

OnStep = Callable[[int, LatentState, LatentState | None], None]


@dataclass(frozen=True)
class Split:
    """A stage's k-way split: `group` None runs the k shards in this process (`farm render --local`),
    else this process is its rank of that `mx.distributed` group. The token count is the stage's
    (conditioning tokens included), known once its states are built."""

    degree: int
    group: object | None = None

    def exchange(self, tokens: int) -> Exchange:
        plan = ShardPlan(tokens, self.degree)
        return LocalExchange(plan) if self.group is None else GroupExchange(plan, self.group)


@dataclass(frozen=True)
class Resume:
    """States after `step` finished steps (what `on_step` was handed)."""

    step: int
    video: LatentState
    audio: LatentState | None


def sp_forward_fn(model, contexts: dict[str, np.ndarray], marker: np.ndarray | None, ex: Exchange,
                  mask: np.ndarray | None = None) -> Forward:
    """`denoise.model_forward` with the video tokens split as `ex` says; `mask` (1, T, T): IC-LoRA control's
    self-attention strengths over all T tokens (each rank's shard takes its query rows, the keys are whole)."""

    def forward(video: LatentState, audio: LatentState | None, sigma: float):
        v_mod, a_mod = stream_modalities(video, audio, sigma, contexts)
        if marker is not None:
            v_mod.keyframes_mask = mx.array(marker)
        if mask is not None:
            v_mod.attention_mask = mx.array(mask)
        v_out, a_out = sp_forward(model, v_mod, a_mod, ex)
        mx.eval(v_out) if a_out is None else mx.eval(v_out, a_out)
        return np.array(v_out.astype(mx.float32)), None if a_out is None else np.array(a_out.astype(mx.float32))

    return forward


def denoise_steps(video: LatentState, audio: LatentState | None, sigmas: list[float], forward: Forward,
                  start: int = 0, on_step: OnStep | None = None, progress: Callable[[int, int], None] | None = None,
                  ancestral=None) -> tuple[LatentState, LatentState | None]:
    """`denoise.run_denoise` from step `start`, handing the states after each step to `on_step`."""
    steps = len(sigmas) - 1
    for step in range(start, steps):
        velocities = forward(video, audio, float(sigmas[step]))
        video, audio = step_states(video, audio, velocities, sigmas, step, ancestral)
        if on_step is not None:
            on_step(step + 1, video, audio)
        if progress is not None:
            progress(step + 1, steps)
    return video, audio


def denoise_stage1(model, inputs: StageInputs, latent_channels: int, ex: Exchange | Split,
                   progress: Callable[[int, int], None] | None = None, resume: Resume | None = None,
                   on_step: OnStep | None = None) -> dict:
    """`Engine.denoise_stage1` with the sequence-parallel forward (same outputs, same keys); `ex` an
    `Exchange` for the stage's token count, or a `Split` that makes one. Reference tokens (IC-LoRA control,
    Dub-It's video) are video tokens like any conditioning and split with them; Dub-It's reference audio is
    in the audio stream every rank holds whole, dropped from the output as the plain stage drops it."""
    video, audio = build_stage_states(inputs, latent_channels)
    start = 0
    if resume is not None:
        video, audio, start = resume.video, resume.audio, resume.step
    if isinstance(ex, Split):
        ex = ex.exchange(video.num_tokens)
    if video.num_tokens != ex.plan.tokens:
        raise ValueError(f"stage of {video.num_tokens} video tokens for a plan of {ex.plan.tokens}")
    marker = stage_marker(inputs, video.num_tokens) if model.config.use_keyframes_abs_pos_embedding else None
    forward = sp_forward_fn(model, inputs.contexts, marker, ex, attention_mask(inputs, video.num_tokens))
    video, audio = denoise_steps(video, audio, inputs.sigmas, forward, start, on_step, progress, inputs.ancestral())
    audio = generated_audio(audio, inputs)
    out = {
        "video_latent": unpatchify_video(video.latent[:, : inputs.video_tokens], inputs.latent_grid),
        "audio_latent": unpatchify_audio(audio.latent, inputs.audio_channels),
    }
    if inputs.slots:
        from ltx_engine.denoise import stage_slots

        out["slots"] = stage_slots(inputs, video)
    return out
