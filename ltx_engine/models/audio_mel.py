"""Waveform -> log-mel spectrogram in MLX: the audio VAE encoder's front end.

Mirrors ltx_core's `AudioProcessor.waveform_to_mel` (a torchaudio `MelSpectrogram` with a periodic Hann
window, centred frames with reflect padding, magnitude (power 1), Slaney mel scale and Slaney area
norm, then `log(clamp(mel, 1e-5))`). Resampling is not done here: the media decoder hands the
waveform over at the VAE's rate. Pure math over arrays; no file or farm knowledge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

_F_SP = 200.0 / 3  # Slaney: linear below 1 kHz, 200/3 Hz per mel
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = math.log(6.4) / 27.0
LOG_FLOOR = 1e-5


@dataclass(frozen=True)
class MelConfig:
    sample_rate: int = 16000
    n_fft: int = 1024
    hop_length: int = 160
    mel_bins: int = 64

    @classmethod
    def from_config(cls, cfg: dict) -> MelConfig:
        """Read cfg["audio_vae"] as the reference AudioEncoderConfigurator does."""
        vae = cfg.get("audio_vae", {})
        params = vae.get("model", {}).get("params", {})
        pre = vae.get("preprocessing", {})
        stft, mel = pre.get("stft", {}), pre.get("mel", {})
        bins = (params.get("ddconfig", {}).get("mel_bins") or mel.get("n_mel_channels")
                or vae.get("variables", {}).get("mel_bins") or 64)
        return cls(params.get("sampling_rate", 16000), stft.get("filter_length", 1024),
                   stft.get("hop_length", 160), bins)


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz / _F_SP
    high = hz >= _MIN_LOG_HZ
    return np.where(high, _MIN_LOG_MEL + np.log(np.maximum(hz, 1e-12) / _MIN_LOG_HZ) / _LOGSTEP, mel)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    high = mel >= _MIN_LOG_MEL
    return np.where(high, _MIN_LOG_HZ * np.exp(_LOGSTEP * (mel - _MIN_LOG_MEL)), _F_SP * mel)


def mel_filterbank(cfg: MelConfig) -> np.ndarray:
    """(n_fft // 2 + 1, mel_bins) triangular Slaney filters with area norm, float32."""
    n_freqs = cfg.n_fft // 2 + 1
    freqs = np.linspace(0.0, cfg.sample_rate // 2, n_freqs)
    pts = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(cfg.sample_rate / 2.0), cfg.mel_bins + 2))
    diff = pts[1:] - pts[:-1]
    slopes = pts[None, :] - freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    fb = np.maximum(0.0, np.minimum(down, up))
    fb *= 2.0 / (pts[2:] - pts[:-2])[None, :]
    return fb.astype(np.float32)


def hann_window(n: int) -> np.ndarray:
    """Periodic Hann window (torch.hann_window's default)."""
    return (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)).astype(np.float32)


def frame_count(samples: int, hop_length: int) -> int:
    """Centred STFT frames of `samples` samples."""
    return 1 + samples // hop_length


def _frames(x: mx.array, n_fft: int, hop: int) -> mx.array:
    """(R, N) -> (R, frames, n_fft) centred, reflect-padded windows."""
    half = n_fft // 2
    if x.shape[-1] <= half:
        raise ValueError(f"waveform of {x.shape[-1]} samples is too short for reflect padding of {half}")
    left = x[:, 1 : half + 1][:, ::-1]
    right = x[:, -half - 1 : -1][:, ::-1]
    padded = mx.concatenate([left, x, right], axis=1)
    count = frame_count(x.shape[-1], hop)
    idx = mx.arange(count)[:, None] * hop + mx.arange(n_fft)[None, :]
    return padded[:, idx]


def log_mel(waveform: mx.array, cfg: MelConfig) -> mx.array:
    """Waveform (B, C, N) at `cfg.sample_rate` -> log-mel (B, C, frames, mel_bins), float32."""
    b, c, n = waveform.shape
    x = waveform.astype(mx.float32).reshape(b * c, n)
    frames = _frames(x, cfg.n_fft, cfg.hop_length) * mx.array(hann_window(cfg.n_fft))
    magnitude = mx.abs(mx.fft.rfft(frames, axis=-1))
    mel = magnitude @ mx.array(mel_filterbank(cfg))
    out = mx.log(mx.maximum(mel, LOG_FLOOR))
    return out.reshape(b, c, out.shape[1], cfg.mel_bins)
