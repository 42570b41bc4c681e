"""Band-limited resampling of a waveform to the audio VAE's rate, as upstream's encoder front end does.

ltx_core's `AudioProcessor.resample_audio` calls `torchaudio.functional.resample` with its defaults
(windowed sinc, Hann window, lowpass_filter_width 6, rolloff 0.99). This is that kernel and that
strided convolution in numpy float32 (the rates reduced by their gcd, one filter phase per output
sample of a period), so a 44.1 or 48 kHz track reaches the encoder as the reference's would. Pure math.
"""

from __future__ import annotations

import math

import numpy as np

LOWPASS_FILTER_WIDTH = 6
ROLLOFF = 0.99


def sinc_kernel(orig: int, new: int) -> tuple[np.ndarray, int]:
    """(new, 2 * width + orig) float32 filter phases and the padding width, for gcd-reduced rates."""
    base = min(orig, new) * ROLLOFF
    width = math.ceil(LOWPASS_FILTER_WIDTH * orig / base)
    idx = np.arange(-width, width + orig, dtype=np.float32)[None, :] / np.float32(orig)
    t = np.arange(0, -new, -1, dtype=np.float32)[:, None] / np.float32(new) + idx
    t = np.clip(t * np.float32(base), -LOWPASS_FILTER_WIDTH, LOWPASS_FILTER_WIDTH)
    window = np.cos(t * np.float32(math.pi / LOWPASS_FILTER_WIDTH / 2)) ** 2
    t = t * np.float32(math.pi)
    safe = np.where(t == 0, np.float32(1.0), t)
    kernel = np.where(t == 0, np.float32(1.0), np.sin(safe) / safe)
    return (kernel * window * np.float32(base / orig)).astype(np.float32), width


def resample(waveform: np.ndarray, orig_rate: int, new_rate: int) -> np.ndarray:
    """(..., N) at `orig_rate` -> (..., ceil(N * new / orig)) at `new_rate`, float32."""
    wave = np.asarray(waveform, dtype=np.float32)
    if int(orig_rate) == int(new_rate):
        return wave
    gcd = math.gcd(int(orig_rate), int(new_rate))
    orig, new = int(orig_rate) // gcd, int(new_rate) // gcd
    kernel, width = sinc_kernel(orig, new)
    shape, length = wave.shape[:-1], wave.shape[-1]
    flat = np.pad(wave.reshape(-1, length), ((0, 0), (width, width + orig)))
    taps = kernel.shape[1]
    count = (flat.shape[1] - taps) // orig + 1
    windows = np.lib.stride_tricks.as_strided(
        flat,
        (flat.shape[0], count, taps),
        (flat.strides[0], flat.strides[1] * orig, flat.strides[1]),
        writeable=False,
    )
    out = (windows @ kernel.T).reshape(flat.shape[0], -1)[:, : math.ceil(new * length / orig)]
    return np.ascontiguousarray(out.reshape(*shape, -1), dtype=np.float32)
