"""Denoising a stage: latent states, the transformer forward on them, and the step loop.

The loop is the reference's Euler loop: per step, timesteps = sigma * denoise_mask per token, the
model's velocity gives x0 = x - v * timesteps, conditioned tokens are put back to clean, then an
Euler step. States and steps are numpy (`ltx_engine.sampling`), so the coordinator can run the very
same step between tiled forwards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from ltx_engine import sampling
from ltx_engine.sampling import LatentState
from ltx_engine.tokens import patchify_audio, patchify_video

Forward = Callable[[LatentState, LatentState | None, float], tuple[np.ndarray, np.ndarray | None]]


@dataclass
class StageInputs:
    """What one denoising stage needs, all numpy; built by the worker runner from task params."""

    frames: int
    height: int
    width: int
    fps: float
    seed: int
    sigmas: list[float]
    contexts: dict[str, np.ndarray]
    audio_channels: int = 8
    mel_bins: int = 16
    audio_frames: int = 0
    initial_video: np.ndarray | None = None     # normalised latent to start from (stage 2)
    initial_audio: np.ndarray | None = None     # frozen audio latent (stage 2)
    image_latent: np.ndarray | None = None
    image_frame: int = 0
    image_strength: float = 1.0
    noise_stream: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def latent_grid(self) -> tuple[int, int, int]:
        return ((self.frames - 1) // 8 + 1, self.height // 32, self.width // 32)

    @property
    def video_tokens(self) -> int:
        f, h, w = self.latent_grid
        return f * h * w


def _positions(inputs: StageInputs) -> tuple[np.ndarray, np.ndarray]:
    from ltx_engine import patchify

    f, h, w = inputs.latent_grid
    video = patchify.video_positions(1, f, h, w, inputs.fps)
    audio = patchify.audio_positions(1, inputs.audio_frames)
    return np.array(video, dtype=np.float32), np.array(audio, dtype=np.float32)


def _condition_on_image(video: LatentState, inputs: StageInputs, vpos: np.ndarray) -> LatentState:
    tokens = patchify_video(inputs.image_latent.astype(np.float32))
    if inputs.image_frame == 0:
        return video.replace_tokens(0, tokens, inputs.image_strength)
    from ltx_engine import patchify

    _, h, w = inputs.latent_grid
    pos = np.array(patchify.keyframe_positions(1, inputs.image_frame, h, w, inputs.fps), dtype=np.float32)
    return video.append_tokens(tokens, pos, inputs.image_strength)


def build_stage_states(inputs: StageInputs, latent_channels: int) -> tuple[LatentState, LatentState]:
    """Initial (noised) video and audio states of a stage, with image conditioning applied."""
    vpos, apos = _positions(inputs)
    if inputs.initial_video is not None:
        video_clean = patchify_video(inputs.initial_video.astype(np.float32))
    else:
        video_clean = np.zeros((1, inputs.video_tokens, latent_channels), np.float32)
    video = LatentState.initial(video_clean, vpos)
    if inputs.image_latent is not None:
        video = _condition_on_image(video, inputs, vpos)
    sigma0 = float(inputs.sigmas[0])
    noise = sampling.noise(video.latent.shape, inputs.seed, sampling.stream_id(sampling.STREAM_VIDEO, inputs.noise_stream))
    video = video.noised(noise, sigma0)
    if inputs.initial_audio is not None:  # frozen: clean context, never denoised (mask 0)
        audio_clean = patchify_audio(inputs.initial_audio.astype(np.float32))
        audio = LatentState.initial(audio_clean, apos)
        return video, LatentState(audio.latent, np.zeros_like(audio.denoise_mask), audio.clean_latent, audio.positions)
    audio_clean = np.zeros((1, inputs.audio_frames, inputs.audio_channels * inputs.mel_bins), np.float32)
    audio = LatentState.initial(audio_clean, apos)
    anoise = sampling.noise(audio.latent.shape, inputs.seed, sampling.stream_id(sampling.STREAM_AUDIO, inputs.noise_stream))
    return video, audio.noised(anoise, sigma0)


def modality(latent: np.ndarray, timesteps: np.ndarray, positions: np.ndarray, sigma: float,
             context: np.ndarray, mask: np.ndarray | None):
    """A transformer Modality from numpy tokens, per-token timesteps (B, T) and positions.

    A stream with no token left to denoise (stage 2's frozen audio) is frozen: its scalar sigma is 0,
    as upstream's `modality_from_latent_state` forces for frozen states, so its prompt AdaLN and the
    other stream's cross-attention gate read 0 rather than the step's sigma (DFR does the same).
    """
    from ltx_engine.models.transformer import Modality

    if not np.any(timesteps):
        sigma = 0.0
    return Modality(
        latent=mx.array(latent),
        sigma=mx.array(np.full((latent.shape[0],), sigma, np.float32)),
        timesteps=mx.array(timesteps),
        positions=mx.array(positions),
        context=mx.array(context),
        context_mask=None if mask is None else mx.array(mask),
    )


def state_modality(state: LatentState, sigma: float, context: np.ndarray, mask: np.ndarray | None):
    """A Modality from a numpy state at `sigma` (per-token timesteps = sigma * denoise mask)."""
    timesteps = sampling.timesteps_from_mask(state.denoise_mask, sigma)[..., 0]
    return modality(state.latent, timesteps, state.positions, sigma, context, mask)


def _run_model(model, v_mod, a_mod) -> tuple[np.ndarray, np.ndarray | None]:
    v_out, a_out = model(v_mod, a_mod)
    mx.eval(v_out, a_out) if a_out is not None else mx.eval(v_out)
    v_np = np.array(v_out.astype(mx.float32))
    return v_np, None if a_out is None else np.array(a_out.astype(mx.float32))


def forward_tokens(model, tokens: dict[str, np.ndarray], sigma: float, contexts: dict[str, np.ndarray]) -> np.ndarray:
    """Video velocity of one forward on a token set (a tile): latent/timesteps/positions plus the
    untiled audio tokens as context (their output is not needed: stage-2 audio is frozen)."""
    mask = contexts.get("context_mask")
    v_mod = modality(tokens["latent"], tokens["timesteps"], tokens["positions"], sigma, contexts["video_context"], mask)
    a_mod = None
    if "audio_latent" in tokens:
        a_t = sampling.timesteps_from_mask(tokens["audio_mask"], sigma)[..., 0]
        a_mod = modality(tokens["audio_latent"], a_t, tokens["audio_positions"], sigma, contexts["audio_context"], mask)
    return _run_model(model, v_mod, a_mod)[0]


def model_forward(model, video: LatentState, audio: LatentState | None, sigma: float,
                  contexts: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """Velocities of one forward, as float32 numpy."""
    mask = contexts.get("context_mask")
    v_mod = state_modality(video, sigma, contexts["video_context"], mask)
    a_mod = None if audio is None else state_modality(audio, sigma, contexts["audio_context"], mask)
    return _run_model(model, v_mod, a_mod)


def step_states(video: LatentState, audio: LatentState | None, velocities: tuple, sigmas: list[float],
                step: int) -> tuple[LatentState, LatentState | None]:
    """One Euler step of both modalities from their velocities (the step the coordinator also runs)."""
    sigma = float(sigmas[step])
    v_vel, a_vel = velocities
    x0 = sampling.x0_from_velocity(video.latent, v_vel, sampling.timesteps_from_mask(video.denoise_mask, sigma))
    video = sampling.denoise_step(video, x0, sigmas, step)
    if audio is not None and a_vel is not None:
        a_x0 = sampling.x0_from_velocity(audio.latent, a_vel, sampling.timesteps_from_mask(audio.denoise_mask, sigma))
        audio = sampling.denoise_step(audio, a_x0, sigmas, step)
    return video, audio


def run_denoise(video: LatentState, audio: LatentState | None, sigmas: list[float], forward: Forward,
                progress: Callable[[int, int], None] | None = None) -> tuple[LatentState, LatentState | None]:
    """The Euler loop over `sigmas`; `progress(step, steps)` after each step."""
    steps = len(sigmas) - 1
    for step in range(steps):
        velocities = forward(video, audio, float(sigmas[step]))
        video, audio = step_states(video, audio, velocities, sigmas, step)
        if progress is not None:
            progress(step + 1, steps)
    return video, audio
