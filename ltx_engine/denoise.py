"""Denoising a stage: latent states, the transformer forward on them, and the step loop.

The loop is the reference's Euler loop: per step, timesteps = sigma * denoise_mask per token, the
model's velocity gives x0 = x - v * timesteps, conditioned tokens are put back to clean, then an
Euler step. States and steps are numpy (`ltx_engine.rules.sampling`), so the coordinator can run the very
same step between tiled forwards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from ltx_engine.conditioning import ImageCondition, apply_image_conditions
from ltx_engine.rules import sampling
from ltx_engine.rules.sampling import LatentState
from ltx_engine.rules.tokens import patchify_audio, patchify_video, unpatchify_video

Forward = Callable[[LatentState, LatentState | None, float], tuple[np.ndarray, np.ndarray | None]]


@dataclass(frozen=True)
class Ancestral:
    """Euler-ancestral stepping: eta, and the seed each step's re-noise is keyed by (stream, step)."""

    eta: float
    seed: int

    def fresh(self, shape: tuple[int, ...], stream: int, step: int) -> np.ndarray:
        return sampling.noise(shape, self.seed, sampling.stream_id(stream, step))


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
    sampler: str = sampling.EULER                # EULER_ANCESTRAL: LTX-2.5's stages (generation.py)
    ancestral_offset: int = sampling.ANCESTRAL_NOISE_SEED_OFFSET  # stage 2: ANCESTRAL_STAGE2_NOISE_SEED_OFFSET
    slots: tuple[int, ...] = ()                  # DFR: generated keyframe slots at these pixel frames
    slot_latent: np.ndarray | None = None        # (1, C, K, h, w) the slots start from (stage 2)
    renoise_audio: bool = False                  # DFR stage 2: stage 1's audio re-noised and denoised along
    reference_latent: np.ndarray | None = None   # IC-LoRA reference (DFR detailing: stage 1's half-res video)
    reference_downscale: int = 1                 # target / reference spatial ratio (the LoRA's metadata)
    images: tuple[ImageCondition, ...] = ()      # several images / keyframes (`ltx_engine.conditioning`)
    sparse_taus: tuple[float, ...] | None = None  # sparse self-attention, one tau per step (stage 2)
    compute_dtype: str | None = None             # "float16" / "bfloat16": attention and FF narrower
    step_cache: float | None = None              # the step cache's threshold (`ltx_engine.step_cache`)
    retake: object | None = None                 # retake.RetakeWindow: initial_video/audio are the source's
    audio_pin: np.ndarray | None = None          # extend: the source's boundary audio latent, pinned
    audio_pin_start: int = 0                     # ... at this audio token of the window
    control: object | None = None                # ic_lora.ControlReference: IC-LoRA control / Dub-It video
    audio_reference: np.ndarray | None = None    # Dub-It: reference audio latent appended (negative time)
    extra: dict = field(default_factory=dict)

    def ancestral(self) -> Ancestral | None:
        """The stage's ancestral stepping, or None for plain Euler."""
        if self.sampler == sampling.EULER:
            return None
        if self.sampler != sampling.EULER_ANCESTRAL:
            raise ValueError(f"unknown sampler {self.sampler!r}")
        return Ancestral(sampling.STAGE1_ANCESTRAL_ETA, self.seed + self.ancestral_offset)

    @property
    def latent_grid(self) -> tuple[int, int, int]:
        return ((self.frames - 1) // 8 + 1, self.height // 32, self.width // 32)

    @property
    def video_tokens(self) -> int:
        f, h, w = self.latent_grid
        return f * h * w

    @property
    def reference_tokens(self) -> int:
        """Tokens the IC-LoRA reference appends last (after the slots)."""
        return 0 if self.reference_latent is None else int(np.prod(self.reference_latent.shape[2:]))


def _positions(inputs: StageInputs) -> tuple[np.ndarray, np.ndarray]:
    from ltx_engine.models import patchify

    f, h, w = inputs.latent_grid
    video = patchify.video_positions(1, f, h, w, inputs.fps)
    audio = patchify.audio_positions(1, inputs.audio_frames)
    return np.array(video, dtype=np.float32), np.array(audio, dtype=np.float32)


def _condition_on_image(video: LatentState, inputs: StageInputs, vpos: np.ndarray) -> LatentState:
    tokens = patchify_video(inputs.image_latent.astype(np.float32))
    if inputs.image_frame == 0:
        return video.replace_tokens(0, tokens, inputs.image_strength)
    from ltx_engine.models import patchify

    _, h, w = inputs.latent_grid
    pos = np.array(patchify.keyframe_positions(1, inputs.image_frame, h, w, inputs.fps), dtype=np.float32)
    return video.append_tokens(tokens, pos, inputs.image_strength)


def _append_slots(video: LatentState, inputs: StageInputs) -> LatentState:
    """Generated keyframe slots (upstream VideoGeneratedKeyframeSlots): one latent frame of tokens per
    slot at a single pixel frame [p, p + 1), mask 1, clean 0, starting from `slot_latent` (or 0)."""
    from ltx_engine.models import patchify

    _, h, w = inputs.latent_grid
    channels = video.latent.shape[2]
    if inputs.slot_latent is not None and inputs.slot_latent.shape[2] != len(inputs.slots):
        raise ValueError(f"slot latent K={inputs.slot_latent.shape[2]} != {len(inputs.slots)} slots")
    for k, frame in enumerate(inputs.slots):
        init = (np.zeros((1, h * w, channels), np.float32) if inputs.slot_latent is None
                else patchify_video(inputs.slot_latent[:, :, k : k + 1].astype(np.float32)))
        pos = np.array(patchify.keyframe_positions(1, frame, h, w, inputs.fps), dtype=np.float32)
        video = video.append_tokens(0 * init, pos, 0.0, latent=init)  # mask 1: generated, not given
    return video


def stage_marker(inputs: StageInputs, num_tokens: int) -> np.ndarray:
    """(1, T, 1) keyframe marker: the first latent frame (one pixel frame, as upstream marks every
    video state's) and the slots; a DiT without LTX-2.5's keyframe embedding ignores it."""
    _, h, w = inputs.latent_grid
    marker = np.zeros((1, num_tokens, 1), np.float32)
    marker[:, : h * w] = 1.0
    if inputs.slots:
        end = num_tokens - inputs.reference_tokens
        marker[:, end - len(inputs.slots) * h * w : end] = 1.0
    return marker


def stage_slots(inputs: StageInputs, video: LatentState) -> np.ndarray:
    """The slots' latent (1, C, K, h, w) from a stage's final state (appended last but the reference)."""
    _, h, w = inputs.latent_grid
    end = video.num_tokens - inputs.reference_tokens
    tokens = video.latent[:, end - len(inputs.slots) * h * w : end]
    return unpatchify_video(tokens, (len(inputs.slots), h, w))


def append_reference(video: LatentState, inputs: StageInputs, strength: float = 1.0) -> LatentState:
    """IC-LoRA reference tokens (upstream VideoConditionByReferenceLatent): clean = the reference, latent
    0, mask 1 - strength, positions of its own grid (causal fix, seconds at the stage's fps) with height
    and width scaled by the downscale factor into the target's pixels; never marked."""
    from ltx_engine.models import patchify

    ref = inputs.reference_latent.astype(np.float32)
    f, h, w = ref.shape[2:]
    positions = np.array(patchify.video_positions(1, f, h, w, inputs.fps), dtype=np.float32)
    positions[:, 1:] *= np.float32(inputs.reference_downscale)
    tokens = patchify_video(ref)
    return video.append_tokens(tokens, positions, strength)


def _audio_state(inputs: StageInputs, apos: np.ndarray, sigma0: float) -> LatentState:
    audio = LatentState.initial(patchify_audio(inputs.initial_audio.astype(np.float32)), apos)
    if not inputs.renoise_audio:  # frozen: clean context, never denoised (mask 0)
        return LatentState(audio.latent, np.zeros_like(audio.denoise_mask), audio.clean_latent, audio.positions)
    noise = sampling.noise(audio.latent.shape, inputs.seed, sampling.stream_id(sampling.STREAM_AUDIO, inputs.noise_stream))
    return audio.noised(noise, sigma0)


def build_stage_states(inputs: StageInputs, latent_channels: int) -> tuple[LatentState, LatentState]:
    """Initial (noised) video and audio states of a stage, with image conditioning and slots applied."""
    vpos, apos = _positions(inputs)
    if inputs.retake is not None:  # media pipelines: `ltx_engine.media_stage`
        from ltx_engine.media_stage import retake_stage_states

        return retake_stage_states(inputs, vpos, apos)
    if inputs.initial_video is not None:
        video_clean = patchify_video(inputs.initial_video.astype(np.float32))
    else:
        video_clean = np.zeros((1, inputs.video_tokens, latent_channels), np.float32)
    video = LatentState.initial(video_clean, vpos)
    if inputs.image_latent is not None:
        video = _condition_on_image(video, inputs, vpos)
    if inputs.images:
        video = apply_image_conditions(video, inputs.images, inputs.latent_grid, inputs.frames, inputs.fps)
    if inputs.control is not None:
        from ltx_engine.media_stage import apply_control

        video = apply_control(video, inputs)
    sigma0 = float(inputs.sigmas[0])
    noise = sampling.noise(video.latent.shape, inputs.seed, sampling.stream_id(sampling.STREAM_VIDEO, inputs.noise_stream))
    if inputs.slots:  # DFR: slots (and the detailing reference) appended before the noise
        video = _append_slots(video, inputs)
        if inputs.reference_latent is not None:
            video = append_reference(video, inputs)
        noise = sampling.noise(video.latent.shape, inputs.seed, sampling.stream_id(sampling.STREAM_VIDEO, inputs.noise_stream))
    video = video.noised(noise, sigma0)
    return video, _media_audio(_generated_audio_state(inputs, apos, sigma0), inputs)


def build_audio_state(inputs: StageInputs) -> LatentState:
    """An audio-only stage's initial (noised) state (T2A: no video tokens); its noise is the stream a
    joint stage's audio draws."""
    from ltx_engine.models import patchify

    apos = np.array(patchify.audio_positions(1, inputs.audio_frames), dtype=np.float32)
    return _generated_audio_state(inputs, apos, float(inputs.sigmas[0]))


def _generated_audio_state(inputs: StageInputs, apos: np.ndarray, sigma0: float) -> LatentState:
    if inputs.initial_audio is not None:
        return _audio_state(inputs, apos, sigma0)
    audio_clean = np.zeros((1, inputs.audio_frames, inputs.audio_channels * inputs.mel_bins), np.float32)
    audio = LatentState.initial(audio_clean, apos)
    if inputs.audio_pin is not None:  # extend: the source's boundary audio, mask 0
        from ltx_engine.media_stage import pin_audio

        audio = pin_audio(audio, inputs)
    anoise = sampling.noise(audio.latent.shape, inputs.seed, sampling.stream_id(sampling.STREAM_AUDIO, inputs.noise_stream))
    return audio.noised(anoise, sigma0)


def _media_audio(audio: LatentState, inputs: StageInputs) -> LatentState:
    """Dub-It's reference audio appended after the noise (mask 0: the noise would leave it as it is)."""
    if inputs.audio_reference is None:
        return audio
    from ltx_engine.media_stage import reference_audio

    return reference_audio(audio, inputs)


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


def stream_modalities(video: LatentState | None, audio: LatentState | None, sigma: float,
                      contexts: dict[str, np.ndarray]) -> tuple:
    """Both streams' Modalities at `sigma` (None where a stream is absent), each with its text mask
    (`ltx_engine.relay`: the context mask, or Prompt Relay's bias of its own tokens)."""
    from ltx_engine.relay import text_mask

    v_mod = None if video is None else state_modality(video, sigma, contexts["video_context"],
                                                      text_mask(contexts, video.positions))
    a_mod = None if audio is None else state_modality(audio, sigma, contexts["audio_context"],
                                                      text_mask(contexts, audio.positions, audio=True))
    return v_mod, a_mod


def _run_model(model, v_mod, a_mod, options=None, positions: np.ndarray | None = None,
               cache=None) -> tuple[np.ndarray, np.ndarray | None]:
    """One forward as float32 numpy; `options` (`ltx_engine.models.forward_options`): sparse tau, compute dtype;
    `cache`: the step cache (`ltx_engine.step_cache.StepCache`) of the chain this forward is a step of."""
    from ltx_engine.models import forward_options

    def call() -> tuple:
        v_out, a_out = model(v_mod, a_mod) if cache is None else model(v_mod, a_mod, cache=cache)
        mx.eval(v_out, a_out) if a_out is not None else mx.eval(v_out)
        return v_out, a_out

    v_out, a_out = forward_options.run(model, call, options, positions)
    v_np = np.array(v_out.astype(mx.float32))
    return v_np, None if a_out is None else np.array(a_out.astype(mx.float32))


def forward_tokens(model, tokens: dict[str, np.ndarray], sigma: float, contexts: dict[str, np.ndarray],
                   options=None, cache=None) -> np.ndarray:
    """Video velocity of one forward on a token set (a tile): latent/timesteps/positions plus the
    untiled audio tokens as context (their output is not needed: stage-2 audio is frozen)."""
    from ltx_engine.relay import text_mask

    v_mod = modality(tokens["latent"], tokens["timesteps"], tokens["positions"], sigma, contexts["video_context"],
                     text_mask(contexts, tokens["positions"]))
    if "keyframes" in tokens:  # LTX-2.5: the tile's share of the state's keyframe marker
        v_mod.keyframes_mask = mx.array(tokens["keyframes"])
    a_mod = None
    if "audio_latent" in tokens:
        a_t = sampling.timesteps_from_mask(tokens["audio_mask"], sigma)[..., 0]
        a_mod = modality(tokens["audio_latent"], a_t, tokens["audio_positions"], sigma, contexts["audio_context"],
                         text_mask(contexts, tokens["audio_positions"], audio=True))
    return _run_model(model, v_mod, a_mod, options, tokens["positions"], cache)[0]


def model_forward(model, video: LatentState, audio: LatentState | None, sigma: float,
                  contexts: dict[str, np.ndarray], marker: np.ndarray | None = None,
                  options=None, attention_mask: np.ndarray | None = None,
                  cache=None) -> tuple[np.ndarray, np.ndarray | None]:
    """Velocities of one forward, as float32 numpy; `marker` (1, T, 1) flags single-pixel-frame tokens;
    `attention_mask` (1, T, T) in [0, 1]: the video's self-attention strengths (IC-LoRA control)."""
    v_mod, a_mod = stream_modalities(video, audio, sigma, contexts)
    if marker is not None:
        v_mod.keyframes_mask = mx.array(marker)
    if attention_mask is not None:
        v_mod.attention_mask = mx.array(attention_mask)
    return _run_model(model, v_mod, a_mod, options, video.positions, cache)


def _step(state: LatentState, velocity: np.ndarray, sigmas: list[float], step: int, ancestral: Ancestral | None,
          stream: int) -> LatentState:
    sigma = float(sigmas[step])
    x0 = sampling.x0_from_velocity(state.latent, velocity, sampling.timesteps_from_mask(state.denoise_mask, sigma))
    if ancestral is None:
        return sampling.denoise_step(state, x0, sigmas, step)
    fresh = ancestral.fresh(state.latent.shape, stream, step) if float(sigmas[step + 1]) != 0 else None
    return sampling.ancestral_denoise_step(state, x0, sigmas, step, ancestral.eta, fresh)


def step_states(video: LatentState, audio: LatentState | None, velocities: tuple, sigmas: list[float],
                step: int, ancestral: Ancestral | None = None) -> tuple[LatentState, LatentState | None]:
    """One Euler (or Euler-ancestral) step of both modalities from their velocities."""
    v_vel, a_vel = velocities
    video = _step(video, v_vel, sigmas, step, ancestral, sampling.STREAM_VIDEO_ANCESTRAL)
    if audio is not None and a_vel is not None:
        audio = _step(audio, a_vel, sigmas, step, ancestral, sampling.STREAM_AUDIO_ANCESTRAL)
    return video, audio


def run_denoise(video: LatentState, audio: LatentState | None, sigmas: list[float], forward: Forward,
                progress: Callable[[int, int], None] | None = None,
                ancestral: Ancestral | None = None) -> tuple[LatentState, LatentState | None]:
    """The Euler loop over `sigmas` (ancestral when given); `progress(step, steps)` after each step."""
    steps = len(sigmas) - 1
    for step in range(steps):
        velocities = forward(video, audio, float(sigmas[step]))
        video, audio = step_states(video, audio, velocities, sigmas, step, ancestral)
        if progress is not None:
            progress(step + 1, steps)
    return video, audio
