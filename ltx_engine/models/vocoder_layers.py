"""Vocoder building blocks: snake activations, anti-aliased (kaiser-sinc) resampling, residual blocks.

Signals are channels-last (B, T, C). Resampling filters are checkpoint buffers of shape (1, K, 1)
(torch (1, 1, K) moved channels-last) applied to every channel alike.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np


def kaiser_sinc_filter(cutoff: float, half_width: float, kernel_size: int) -> np.ndarray:
    """BigVGAN's kaiser-windowed sinc low-pass, (kernel_size,); the default the checkpoint overrides."""
    even = kernel_size % 2 == 0
    half = kernel_size // 2
    amplitude = 2.285 * (half - 1) * math.pi * 4 * half_width + 7.95
    if amplitude > 50.0:
        beta = 0.1102 * (amplitude - 8.7)
    elif amplitude >= 21.0:
        beta = 0.5842 * (amplitude - 21) ** 0.4 + 0.07886 * (amplitude - 21.0)
    else:
        beta = 0.0
    window = np.kaiser(kernel_size, beta)
    time = np.arange(-half, half) + 0.5 if even else np.arange(kernel_size) - half
    if cutoff == 0:
        return np.zeros(kernel_size, dtype=np.float32)
    filt = 2 * cutoff * window * np.sinc(2 * cutoff * time)
    return (filt / filt.sum()).astype(np.float32)


def hann_sinc_filter(ratio: int, rolloff: float = 0.99, lowpass_filter_width: int = 6) -> tuple[np.ndarray, int]:
    """Hann-windowed sinc upsampling filter (torchaudio-style resample); returns (filter, width)."""
    width = math.ceil(lowpass_filter_width / rolloff)
    kernel_size = 2 * width * ratio + 1
    t = (np.arange(kernel_size, dtype=np.float32) / ratio - width) * rolloff
    tc = np.clip(t, -lowpass_filter_width, lowpass_filter_width)
    window = np.cos(tc * math.pi / lowpass_filter_width / 2) ** 2
    return (np.sinc(t) * window * rolloff / ratio).astype(np.float32), width


def upsample_with_filter(x: mx.array, filt: mx.array, ratio: int, pad: int, crop: tuple[int, int]) -> mx.array:
    """Reference UpSample1d: replicate pad, depthwise transposed conv (stride ratio), x ratio, crop.

    The transposed conv runs as zero-stuffing plus a depthwise correlation with the reversed filter
    (twice as fast as conv_transpose1d on the CPU backend).
    """
    b, _, c = x.shape
    k = filt.shape[1]
    y = mx.pad(x, [(0, 0), (pad, pad), (0, 0)], mode="edge")
    n = y.shape[1]
    z = mx.concatenate([y[:, :, None], mx.zeros((b, n, ratio - 1, c), dtype=y.dtype)], axis=2)
    z = mx.pad(z.reshape(b, n * ratio, c)[:, : (n - 1) * ratio + 1], [(0, 0), (k - 1, k - 1), (0, 0)])
    w = mx.broadcast_to(filt[:, ::-1].astype(y.dtype), (c, k, 1))
    y = ratio * mx.conv1d(z, w, groups=c)
    return y[:, crop[0]: y.shape[1] - crop[1]]


class UpSample1d(nn.Module):
    """Kaiser-sinc x`ratio` upsampler whose filter is a checkpoint buffer."""

    def __init__(self, ratio: int = 2, kernel_size: int | None = None):
        super().__init__()
        self.ratio = ratio
        k = int(6 * ratio // 2) * 2 if kernel_size is None else kernel_size
        self.pad = k // ratio - 1
        self.crop = (self.pad * ratio + (k - ratio) // 2, self.pad * ratio + (k - ratio + 1) // 2)
        self.filter = mx.array(kaiser_sinc_filter(0.5 / ratio, 0.6 / ratio, k)[None, :, None])

    def __call__(self, x: mx.array) -> mx.array:
        return upsample_with_filter(x, self.filter, self.ratio, self.pad, self.crop)


class LowPassFilter1d(nn.Module):
    def __init__(self, cutoff: float, half_width: float, stride: int, kernel_size: int):
        super().__init__()
        self.stride = stride
        self.pads = (kernel_size // 2 - int(kernel_size % 2 == 0), kernel_size // 2)
        self.filter = mx.array(kaiser_sinc_filter(cutoff, half_width, kernel_size)[None, :, None])

    def __call__(self, x: mx.array) -> mx.array:
        c, k = x.shape[-1], self.filter.shape[1]
        y = mx.pad(x, [(0, 0), self.pads, (0, 0)], mode="edge")
        return mx.conv1d(y, mx.broadcast_to(self.filter.astype(y.dtype), (c, k, 1)), stride=self.stride, groups=c)


class DownSample1d(nn.Module):
    def __init__(self, ratio: int = 2, kernel_size: int | None = None):
        super().__init__()
        k = int(6 * ratio // 2) * 2 if kernel_size is None else kernel_size
        self.lowpass = LowPassFilter1d(0.5 / ratio, 0.6 / ratio, ratio, k)

    def __call__(self, x: mx.array) -> mx.array:
        return self.lowpass(x)


def _snake_beta(x: mx.array, log_alpha: mx.array, log_beta: mx.array) -> mx.array:
    a, b = mx.exp(log_alpha), mx.exp(log_beta)
    return x + (1.0 / (b + 1e-9)) * mx.square(mx.sin(x * a))


class Snake(nn.Module):
    """x + sin^2(a x) / a with log-scale a (the reference default)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = mx.zeros((channels,))

    def __call__(self, x: mx.array) -> mx.array:
        return _snake_beta(x, self.alpha, self.alpha)


class SnakeBeta(nn.Module):
    """x + sin^2(a x) / b with log-scale a and b."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = mx.zeros((channels,))
        self.beta = mx.zeros((channels,))

    def __call__(self, x: mx.array) -> mx.array:
        return _snake_beta(x, self.alpha, self.beta)


class Activation1d(nn.Module):
    """Anti-aliased activation: x2 upsample, snake, x2 low-pass downsample (12-tap filters)."""

    def __init__(self, channels: int, activation: str):
        super().__init__()
        self.act = SnakeBeta(channels) if activation == "snakebeta" else Snake(channels)
        self.upsample = UpSample1d(2, 12)
        self.downsample = DownSample1d(2, 12)

    def __call__(self, x: mx.array) -> mx.array:
        return self.downsample(self.act(self.upsample(x)))


def _conv(ch: int, k: int, d: int) -> nn.Conv1d:
    return nn.Conv1d(ch, ch, k, padding=(k * d - d) // 2, dilation=d)


class AMPBlock1(nn.Module):
    """BigVGAN v2 residual block: (act, dilated conv, act, conv) three times."""

    def __init__(self, ch: int, kernel_size: int, dilation: tuple[int, ...], activation: str):
        super().__init__()
        self.convs1 = [_conv(ch, kernel_size, d) for d in dilation]
        self.convs2 = [_conv(ch, kernel_size, 1) for _ in dilation]
        self.acts1 = [Activation1d(ch, activation) for _ in dilation]
        self.acts2 = [Activation1d(ch, activation) for _ in dilation]

    def __call__(self, x: mx.array) -> mx.array:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.acts1, self.acts2, strict=True):
            x = x + c2(a2(c1(a1(x))))
        return x


class ResBlock1(nn.Module):
    """HiFi-GAN residual block (LTX-2 vocoder): leaky ReLU, dilated conv, leaky ReLU, conv."""

    def __init__(self, ch: int, kernel_size: int, dilation: tuple[int, ...]):
        super().__init__()
        self.convs1 = [_conv(ch, kernel_size, d) for d in dilation]
        self.convs2 = [_conv(ch, kernel_size, 1) for _ in dilation]

    def __call__(self, x: mx.array) -> mx.array:
        for c1, c2 in zip(self.convs1, self.convs2, strict=True):
            x = x + c2(nn.leaky_relu(c1(nn.leaky_relu(x, 0.1)), 0.1))
        return x
