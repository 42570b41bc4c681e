"""Sigma tables, sampler steps, noise and the latent state: pure numpy float32.

The coordinator's reducer and the in-process reference both call these very functions, so a
distributed render and a local one take bit-identical steps. Formulas follow the reference
(ltx-core's EulerDiffusionStep, EulerAncestralDiffusionStep, GaussianNoiser, X0Model and the
pipelines' post_process_latent); scalar coefficients are computed in float32 as the reference does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

DISTILLED_SIGMAS: tuple[float, ...] = (1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0)
STAGE_2_DISTILLED_SIGMAS: tuple[float, ...] = (0.909375, 0.725, 0.421875, 0.0)
TDP_STAGE_2_SIGMAS: tuple[float, ...] = (0.625, 0.4, 0.0)
# LTX-2.5 uses these same tables (upstream's constants have no per-generation sigmas); what changes is
# stage 1's sampler in the distilled pipeline: ancestral Euler, eta 1, its re-noise keyed by seed + offset.
EULER, EULER_ANCESTRAL = "euler", "euler_ancestral"
STAGE1_ANCESTRAL_ETA = 1.0
ANCESTRAL_NOISE_SEED_OFFSET = 10000
# Upstream after 1.2.0 (distilled.py / dfr_pipeline.py, tests/parity/upstream_rules.py): on LTX-2.5 every
# pass samples ancestrally, each pass from its own seed offset so no two inject the same noise.
ANCESTRAL_STAGE2_NOISE_SEED_OFFSET = 20000

# Named noise streams: distinct Philox keys so video, audio and per-tile noise never collide.
STREAM_VIDEO = 0
STREAM_AUDIO = 1
STREAM_VIDEO_ANCESTRAL = 2
STREAM_AUDIO_ANCESTRAL = 3
_STREAM_SPACE = 1 << 20

F32 = np.float32


def _f32(x: np.ndarray | float) -> np.ndarray:
    return np.asarray(x, dtype=F32)


def stream_id(base: int, index: int = 0) -> int:
    """Combine a named stream with an index (tile, step) into one Philox key word."""
    if not 0 <= base < _STREAM_SPACE or index < 0:
        raise ValueError(f"bad noise stream base={base} index={index}")
    return index * _STREAM_SPACE + base


def noise(shape: tuple[int, ...], seed: int, stream: int = 0) -> np.ndarray:
    """Standard normal float32 noise, identical on every process and platform for (seed, stream).

    Philox is counter based and numpy's float32 normal sampler is platform independent, so a worker
    and the coordinator draw the same numbers without sharing state.
    """
    key = np.array([seed % (1 << 64), stream % (1 << 64)], dtype=np.uint64)
    gen = np.random.Generator(np.random.Philox(key=key))
    return gen.standard_normal(size=tuple(shape), dtype=F32)


def euler_step(x: np.ndarray, x0: np.ndarray, sigma: float, sigma_next: float) -> np.ndarray:
    """First-order Euler step: v = (x - x0) / sigma; x' = x + v * (sigma_next - sigma)."""
    s = F32(sigma)
    if s == 0:
        raise ValueError("sigma can't be 0.0 in an Euler step")
    dt = F32(sigma_next) - s
    v = (_f32(x) - _f32(x0)) / s
    return (_f32(x) + v * dt).astype(F32)


def euler_ancestral_step(
    x: np.ndarray,
    x0: np.ndarray,
    sigma: float,
    sigma_next: float,
    eta: float,
    noise: np.ndarray | None,
    s_noise: float = 1.0,
) -> np.ndarray:
    """Rectified-flow ancestral Euler step (alpha = 1 - sigma), as the reference.

    Steps deterministically to sigma_down <= sigma_next, then renoises up to sigma_next with the
    signal rescaled by alpha_next / alpha_down. eta = 0 is plain Euler; sigma_next = 0 returns x0.
    """
    s, sn = F32(sigma), F32(sigma_next)
    if sn == 0:
        return _f32(x0).copy()
    if eta > 0 and noise is None:
        raise ValueError("euler_ancestral_step needs a noise array when eta > 0")
    ratio = F32(1.0) + (sn / s - F32(1.0)) * F32(eta)
    sigma_down = sn * ratio
    r = sigma_down / s
    x_next = r * _f32(x) + (F32(1.0) - r) * _f32(x0)
    if eta > 0:
        a_next = F32(1.0) - sn
        a_down = F32(1.0) - sigma_down
        var = sn**2 - sigma_down**2 * a_next**2 / a_down**2
        renoise = F32(np.sqrt(max(var, F32(0.0))))
        x_next = (a_next / a_down) * x_next + _f32(noise) * F32(s_noise) * renoise
    return x_next.astype(F32)


def euler_cfg_pp_step(
    x: np.ndarray,
    x0_cond: np.ndarray,
    x0_uncond: np.ndarray,
    sigma: float,
    sigma_next: float,
    eta: float = 1.0,
    noise: np.ndarray | None = None,
    s_noise: float = 1.0,
) -> np.ndarray:
    """Euler CFG++ step (upstream `EulerCfgPpDiffusionStep`, arXiv 2406.08070), float32.

    The direction toward the noise comes from the UNconditioned x0, d = (x - alpha uncond) / sigma
    (alpha = 1 - sigma, held above float32 eps), while the step lands on the conditioned x0: in the
    rescaled sigma / alpha space a DDIM ancestral split gives sigma_down and sigma_up (eta 0: plain),
    x' = alpha' cond + alpha' sigma_down d, plus alpha' sigma_up s_noise noise when eta > 0.
    """
    if not 0.0 <= eta <= 1.0 or s_noise < 0.0:
        raise ValueError(f"CFG++ eta {eta} must be in [0, 1] and s_noise {s_noise} >= 0")
    tiny = F32(np.finfo(F32).eps)
    s, t = F32(sigma), F32(sigma_next)
    a_s, a_t = max(F32(1.0) - s, tiny), max(F32(1.0) - t, tiny)
    d = (_f32(x) - a_s * _f32(x0_uncond)) / s
    down, up = _ddim_ancestral(s / a_s, t / a_t, eta)
    x_next = a_t * _f32(x0_cond) + (a_t * down) * d
    if noise is not None and eta > 0 and s_noise > 0:
        x_next = x_next + a_t * _f32(noise) * F32(s_noise) * up
    return x_next.astype(F32)


def _ddim_ancestral(sigma_from: np.float32, sigma_to: np.float32, eta: float) -> tuple[np.float32, np.float32]:
    """(sigma_down, sigma_up) of a DDIM ancestral step in the rescaled space (upstream `_get_ancestral_step`)."""
    if not eta:
        return sigma_to, F32(0.0)
    variance = sigma_to**2 * max(sigma_from**2 - sigma_to**2, F32(0.0)) / sigma_from**2
    up = min(F32(eta) * F32(np.sqrt(variance)), sigma_to)
    return F32(np.sqrt(max(sigma_to**2 - up**2, F32(0.0)))), up


def _as_token_column(timesteps: np.ndarray, like: np.ndarray) -> np.ndarray:
    t = _f32(timesteps)
    if t.ndim == like.ndim - 1:
        t = t[..., None]
    return t


def x0_from_velocity(x: np.ndarray, v: np.ndarray, timesteps: np.ndarray | float) -> np.ndarray:
    """X0Model: x0 = x - v * timesteps, timesteps = sigma * denoise_mask per token ((B,T) or (B,T,1))."""
    xs = _f32(x)
    return (xs - _f32(v) * _as_token_column(timesteps, xs)).astype(F32)


def timesteps_from_mask(denoise_mask: np.ndarray, sigma: float) -> np.ndarray:
    """Per-token timesteps (B,T,1) = denoise_mask * sigma, what the transformer reads."""
    return (_f32(denoise_mask) * F32(sigma)).astype(F32)


def lerp_noise(init: np.ndarray, clean: np.ndarray, noise: np.ndarray, scale: float, mask: np.ndarray) -> np.ndarray:
    """GaussianNoiser since ltx-core 1.1.6: lerp(clean, lerp(init, noise, scale), mask); mask (B,T,1).

    It starts each token from its own latent, not its clean value: a keyframe slot seeded with a latent
    keeps (1 - scale) of that seed, a guide (latent 0) keeps 1 - mask of its image, a replaced frame
    lerps from the stage's latent. Where init equals clean it is 1.0.0's noiser up to float rounding;
    mask-0 tokens come out clean exactly.
    """
    s = F32(scale)
    noised = _f32(init) + s * (_f32(noise) - _f32(init))
    return (_f32(clean) + _f32(mask) * (noised - _f32(clean))).astype(F32)


def apply_clean(x0: np.ndarray, clean: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Keep conditioned tokens clean: x0*mask + clean*(1-mask), done on x0 before each step."""
    m = _f32(mask)
    return (_f32(x0) * m + _f32(clean) * (F32(1.0) - m)).astype(F32)


@dataclass(frozen=True)
class LatentState:
    """Patchified latent of one modality plus its conditioning bookkeeping.

    latent (B,T,C), denoise_mask (B,T,1), clean_latent (B,T,C), positions (B,3,T,2) for video
    (B,1,T,2) for audio. Conditioning tokens are appended after the generated tokens.
    """

    latent: np.ndarray
    denoise_mask: np.ndarray
    clean_latent: np.ndarray
    positions: np.ndarray

    def __post_init__(self) -> None:
        b, t, c = self.latent.shape
        if self.clean_latent.shape != (b, t, c):
            raise ValueError(f"clean_latent {self.clean_latent.shape} != latent {self.latent.shape}")
        if self.denoise_mask.shape != (b, t, 1):
            raise ValueError(f"denoise_mask {self.denoise_mask.shape} != {(b, t, 1)}")
        if self.positions.ndim != 4 or self.positions.shape[0] != b or self.positions.shape[2:] != (t, 2):
            raise ValueError(f"positions {self.positions.shape} must be (B, axes, {t}, 2)")

    @property
    def num_tokens(self) -> int:
        return int(self.latent.shape[1])

    @classmethod
    def initial(cls, clean: np.ndarray, positions: np.ndarray) -> LatentState:
        """Fresh state: every token to be denoised (mask 1), clean = the given latent."""
        c = _f32(clean)
        mask = np.ones((*c.shape[:2], 1), dtype=F32)
        return cls(latent=c.copy(), denoise_mask=mask, clean_latent=c.copy(), positions=_f32(positions))

    def append_tokens(self, tokens: np.ndarray, positions: np.ndarray, strength: float,
                      latent: np.ndarray | None = None) -> LatentState:
        """Append conditioning tokens (keyframe / reference) as clean values with denoise mask 1 - strength.

        Their noisy latent is a placeholder of zeros (upstream since ltx-core 1.1.6) unless `latent` is
        given: the noiser lerps from it, so a guide below strength 1 keeps only (1 - mask) of its image.
        """
        tok = _f32(tokens)
        if tok.ndim != 3 or tok.shape[0] != self.latent.shape[0] or tok.shape[2] != self.latent.shape[2]:
            raise ValueError(f"tokens {tok.shape} do not match latent {self.latent.shape}")
        start = np.zeros_like(tok) if latent is None else _f32(latent)
        if start.shape != tok.shape:
            raise ValueError(f"latent {start.shape} != tokens {tok.shape}")
        mask = np.full((*tok.shape[:2], 1), F32(1.0) - F32(strength), dtype=F32)
        return LatentState(
            latent=np.concatenate([self.latent, start], axis=1),
            denoise_mask=np.concatenate([self.denoise_mask, mask], axis=1),
            clean_latent=np.concatenate([self.clean_latent, tok], axis=1),
            positions=np.concatenate([self.positions, _f32(positions)], axis=2),
        )

    def replace_tokens(self, start: int, tokens: np.ndarray, strength: float) -> LatentState:
        """Condition tokens [start, start+n) by latent index: their clean values and mask 1 - strength.

        The noisy latent stays as it was (upstream since ltx-core 1.1.6): in a stage that starts below
        sigma 1 the noiser lerps from the stage's own latent there, not from the image.
        """
        tok = _f32(tokens)
        stop = start + tok.shape[1]
        if start < 0 or stop > self.num_tokens:
            raise ValueError(f"token range [{start}, {stop}) outside 0..{self.num_tokens}")
        clean, mask = self.clean_latent.copy(), self.denoise_mask.copy()
        clean[:, start:stop] = tok
        mask[:, start:stop] = F32(1.0) - F32(strength)
        return replace(self, clean_latent=clean, denoise_mask=mask)

    def truncate(self, num_tokens: int) -> LatentState:
        """Drop appended conditioning tokens, keeping the first num_tokens generated ones."""
        return LatentState(
            latent=self.latent[:, :num_tokens],
            denoise_mask=self.denoise_mask[:, :num_tokens],
            clean_latent=self.clean_latent[:, :num_tokens],
            positions=self.positions[:, :, :num_tokens],
        )

    def noised(self, noise_arr: np.ndarray, sigma: float) -> LatentState:
        """The noiser: lerp(clean, lerp(latent, noise, sigma), mask) per token (`lerp_noise`)."""
        return replace(self, latent=lerp_noise(self.latent, self.clean_latent, noise_arr, sigma, self.denoise_mask))

    def with_latent(self, latent: np.ndarray) -> LatentState:
        return replace(self, latent=_f32(latent))


def denoise_step(
    state: LatentState, x0: np.ndarray, sigmas: tuple[float, ...] | list[float], step: int
) -> LatentState:
    """One Euler step of a state from the model's x0: apply_clean then euler_step."""
    x0c = apply_clean(x0, state.clean_latent, state.denoise_mask)
    return state.with_latent(euler_step(state.latent, x0c, sigmas[step], sigmas[step + 1]))


def ancestral_denoise_step(
    state: LatentState,
    x0: np.ndarray,
    sigmas: tuple[float, ...] | list[float],
    step: int,
    eta: float,
    noise_arr: np.ndarray | None,
) -> LatentState:
    """Ancestral step as the reference loop: clean-blend x0, step, re-apply the mask on a non-final step."""
    x0c = apply_clean(x0, state.clean_latent, state.denoise_mask)
    x_next = euler_ancestral_step(state.latent, x0c, sigmas[step], sigmas[step + 1], eta, noise_arr)
    if F32(sigmas[step + 1]) != 0 and eta > 0:
        x_next = apply_clean(x_next, state.clean_latent, state.denoise_mask)
    return state.with_latent(x_next)
