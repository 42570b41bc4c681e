"""Vocoder (HiFi-GAN / BigVGAN v2) and the LTX-2.3 bandwidth extension to 48 kHz, in MLX.

Mirrors ltx_core.model.audio_vae.vocoder. Signals run channels-last inside as (B, T, C). The model's
attribute paths equal the pack's `vocoder.safetensors` keys with `vocoder.` stripped: the base
generator at the top level (`conv_pre`, `ups`, `resblocks`, `act_post`, `conv_post`) and, for 2.3
checkpoints, `bwe_generator.*` and `mel_stft.*` beside it (the reference's `vocoder.vocoder.*`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ltx_engine.models.audio_vae import AudioDecoder
from ltx_engine.models.vocoder_layers import (
    Activation1d,
    AMPBlock1,
    ResBlock1,
    hann_sinc_filter,
    upsample_with_filter,
)

LRELU_SLOPE = 0.1


@dataclass
class GeneratorConfig:
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    upsample_rates: tuple[int, ...] = (6, 5, 2, 2, 2)
    upsample_kernel_sizes: tuple[int, ...] = (16, 15, 8, 4, 4)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    upsample_initial_channel: int = 1024
    resblock: str = "1"
    output_sampling_rate: int = 24000
    activation: str = "snake"
    use_tanh_at_final: bool = True
    apply_final_activation: bool = True
    use_bias_at_final: bool = True
    in_channels: int = 128  # stereo x 64 mel bins; fixed in the reference

    @classmethod
    def from_section(cls, cfg: dict, apply_final_activation: bool = True,
                     output_sampling_rate: int | None = None) -> GeneratorConfig:
        """One generator section, read as the reference `_vocoder_from_config`."""
        return cls(
            resblock_kernel_sizes=tuple(cfg.get("resblock_kernel_sizes", [3, 7, 11])),
            upsample_rates=tuple(cfg.get("upsample_rates", [6, 5, 2, 2, 2])),
            upsample_kernel_sizes=tuple(cfg.get("upsample_kernel_sizes", [16, 15, 8, 4, 4])),
            resblock_dilation_sizes=tuple(tuple(d) for d in cfg.get("resblock_dilation_sizes",
                                                                    [[1, 3, 5], [1, 3, 5], [1, 3, 5]])),
            upsample_initial_channel=cfg.get("upsample_initial_channel", 1024),
            resblock=cfg.get("resblock", "1"),
            output_sampling_rate=(output_sampling_rate if output_sampling_rate is not None
                                  else cfg.get("output_sampling_rate", 24000)),
            activation=cfg.get("activation", "snake"),
            use_tanh_at_final=cfg.get("use_tanh_at_final", True),
            apply_final_activation=apply_final_activation,
            use_bias_at_final=cfg.get("use_bias_at_final", True),
            in_channels=cfg.get("in_channels", 128),
        )

    @property
    def hop_length(self) -> int:
        return math.prod(self.upsample_rates)


@dataclass
class BWEConfig:
    generator: GeneratorConfig
    input_sampling_rate: int
    output_sampling_rate: int
    hop_length: int
    n_fft: int
    num_mels: int


@dataclass
class VocoderConfig:
    vocoder: GeneratorConfig
    bwe: BWEConfig | None = None

    @classmethod
    def from_config(cls, cfg: dict) -> VocoderConfig:
        """Read cfg["vocoder"]: flat (LTX-2) or nested {"vocoder", "bwe"} (LTX-2.3), as the reference."""
        section = cfg.get("vocoder", {})
        if "bwe" not in section:
            return cls(GeneratorConfig.from_section(section))
        bwe = section["bwe"]
        return cls(
            GeneratorConfig.from_section(section.get("vocoder", {}),
                                         output_sampling_rate=bwe["input_sampling_rate"]),
            BWEConfig(
                generator=GeneratorConfig.from_section(bwe, apply_final_activation=False,
                                                       output_sampling_rate=bwe["output_sampling_rate"]),
                input_sampling_rate=bwe["input_sampling_rate"],
                output_sampling_rate=bwe["output_sampling_rate"],
                hop_length=bwe["hop_length"],
                n_fft=bwe["n_fft"],
                num_mels=bwe["num_mels"],
            ),
        )

    @property
    def sample_rate(self) -> int:
        return self.bwe.output_sampling_rate if self.bwe else self.vocoder.output_sampling_rate


def _generator_section(initial: int, rates: list, kernels: list) -> dict:
    return {"upsample_initial_channel": initial, "resblock": "AMP1", "upsample_rates": rates,
            "resblock_kernel_sizes": [3], "upsample_kernel_sizes": kernels,
            "resblock_dilation_sizes": [[1, 3, 5]], "stereo": True,
            "use_tanh_at_final": False, "activation": "snakebeta", "use_bias_at_final": False}


def tiny_config() -> dict:
    """The 2.3 vocoder + BWE sections with tiny channels: same rates (x160 to 16 kHz, x240 to 48 kHz).

    One resblock kernel per stage where a real pack has three (3, 7, 11): the same block code and key
    layout, fewer of them, as the tiny DiT has fewer blocks. Each stage's AMP blocks run at the full
    sample rate, so three of them made the tiny vocoder 1.5 s of CPU a render, the bulk of the suite's
    audio decodes; with one, 0.6 s."""
    bwe = _generator_section(32, [6, 5, 2, 2, 2], [12, 11, 4, 4, 4])
    bwe.update({"apply_final_activation": False, "input_sampling_rate": 16000, "output_sampling_rate": 48000,
                "hop_length": 80, "n_fft": 512, "win_size": 512, "num_mels": 64})
    return {"vocoder": {"vocoder": _generator_section(64, [5, 2, 2, 2, 2, 2], [11, 4, 4, 4, 4, 4]),
                        "bwe": bwe}}


class Generator(nn.Module):
    """Mel (B, 2, T, mel) -> waveform; channels-last internally (reference `Vocoder`)."""

    def __init__(self, cfg: GeneratorConfig):
        super().__init__()
        self.gen_config = cfg
        self.is_amp = cfg.resblock == "AMP1"
        c0 = cfg.upsample_initial_channel
        self.conv_pre = nn.Conv1d(cfg.in_channels, c0, kernel_size=7, padding=3)
        self.ups = [
            nn.ConvTranspose1d(c0 // 2**i, c0 // 2 ** (i + 1), k, stride=s, padding=(k - s) // 2)
            for i, (s, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True))
        ]
        self.resblocks = []
        for i in range(len(cfg.upsample_rates)):
            ch = c0 // 2 ** (i + 1)
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes, strict=True):
                self.resblocks.append(AMPBlock1(ch, k, d, cfg.activation) if self.is_amp else ResBlock1(ch, k, d))
        final = c0 // 2 ** len(cfg.upsample_rates)
        if self.is_amp:
            self.act_post = Activation1d(final, "snakebeta")
        self.conv_post = nn.Conv1d(final, 2, kernel_size=7, padding=3, bias=cfg.use_bias_at_final)

    def generate(self, mel: mx.array) -> mx.array:
        """mel (B, S, T, M) in the reference layout -> waveform (B, samples, 2) channels-last."""
        b, s, t, m = mel.shape
        x = mel.transpose(0, 2, 1, 3).reshape(b, t, s * m)  # channel index s*M + m, as "b (s c) t"
        x = self.conv_pre(x.astype(self.conv_pre.weight.dtype))
        n = len(self.gen_config.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            if not self.is_amp:
                x = nn.leaky_relu(x, LRELU_SLOPE)
            x = up(x)
            outs = [self.resblocks[j](x) for j in range(i * n, (i + 1) * n)]
            x = mx.mean(mx.stack(outs, axis=0), axis=0)
        x = self.act_post(x) if self.is_amp else nn.leaky_relu(x, 0.01)
        x = self.conv_post(x)
        if self.gen_config.apply_final_activation:
            x = mx.tanh(x) if self.gen_config.use_tanh_at_final else mx.clip(x, -1.0, 1.0)
        return x

    def __call__(self, mel: mx.array) -> mx.array:
        return self.generate(mel).transpose(0, 2, 1)


class STFTFn(nn.Module):
    def __init__(self, n_fft: int):
        super().__init__()
        n_freqs = n_fft // 2 + 1
        # Checkpoint buffers (DFT x causal Hann bases), channels-last conv layout (2F, n_fft, 1).
        self.forward_basis = mx.zeros((2 * n_freqs, n_fft, 1))
        self.inverse_basis = mx.zeros((2 * n_freqs, n_fft, 1))


class MelSTFT(nn.Module):
    """Causal log-mel spectrogram from the checkpoint's STFT bases and mel filterbank."""

    def __init__(self, n_fft: int, hop_length: int, n_mels: int):
        super().__init__()
        self.n_fft, self.hop_length = n_fft, hop_length
        self.stft_fn = STFTFn(n_fft)
        self.mel_basis = mx.zeros((n_mels, n_fft // 2 + 1))

    def __call__(self, y: mx.array) -> mx.array:
        """y (N, T) -> log-mel (N, frames, n_mels)."""
        x = mx.pad(y[:, :, None], [(0, 0), (max(0, self.n_fft - self.hop_length), 0), (0, 0)])
        spec = mx.conv1d(x, self.stft_fn.forward_basis.astype(x.dtype), stride=self.hop_length)
        f = spec.shape[-1] // 2
        mag = mx.sqrt(spec[..., :f] ** 2 + spec[..., f:] ** 2)
        mel = mag @ self.mel_basis.astype(mag.dtype).T
        return mx.log(mx.maximum(mel, 1e-5))


def _is_transposed_conv(key: str) -> bool:
    parts = key.split(".")
    return len(parts) >= 3 and parts[-3] == "ups" and parts[-1] == "weight"


class Vocoder(Generator):
    """Mel (B, 2, T, mel) -> waveform (B, 2, samples) at `sample_rate`; with BWE when configured."""

    def __init__(self, config: VocoderConfig):
        super().__init__(config.vocoder)
        self.config = config
        bwe = config.bwe
        if bwe is not None:
            self.bwe_generator = Generator(bwe.generator)
            self.mel_stft = MelSTFT(bwe.n_fft, bwe.hop_length, bwe.num_mels)
            self._ratio = bwe.output_sampling_rate // bwe.input_sampling_rate
            filt, width = hann_sinc_filter(self._ratio)
            self._resample = (mx.array(filt[None, :, None]), width,
                              (2 * width * self._ratio, filt.shape[0] - self._ratio))

    @classmethod
    def from_config(cls, cfg: dict) -> Vocoder:
        return cls(VocoderConfig.from_config(cfg))

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    def _extend(self, x: mx.array) -> mx.array:
        """Bandwidth extension of a base waveform (B, L, C) -> (B, L * ratio, C), clipped to [-1, 1]."""
        bwe = self.config.bwe
        b, length, c = x.shape
        out_len = length * bwe.output_sampling_rate // bwe.input_sampling_rate
        rem = length % bwe.hop_length
        if rem:
            x = mx.pad(x, [(0, 0), (0, bwe.hop_length - rem), (0, 0)])
        mel = self.mel_stft(x.transpose(0, 2, 1).reshape(b * c, -1))  # (B*C, frames, mels)
        residual = self.bwe_generator.generate(mel.reshape(b, c, *mel.shape[1:]))
        filt, width, crop = self._resample
        skip = upsample_with_filter(x, filt, self._ratio, width, crop)
        if residual.shape != skip.shape:
            raise ValueError(f"BWE residual {residual.shape} != skip {skip.shape}")
        return mx.clip(residual + skip, -1.0, 1.0)[:, :out_len]

    def __call__(self, mel: mx.array) -> mx.array:
        x = self.generate(mel)
        if self.config.bwe is not None:
            x = self._extend(x)
        return x.transpose(0, 2, 1)

    @staticmethod
    def sanitize(weights: dict) -> dict[str, mx.array]:
        """Reference state dict (Vocoder, VocoderWithBWE, or the checkpoint's with `vocoder.` stripped)
        -> our keys, float32 (BigVGAN loses quality in bf16), channels-last conv layouts."""
        out = {}
        for key, value in weights.items():
            name = key.removeprefix("vocoder.")
            v = np.asarray(value, dtype=np.float32) if not isinstance(value, mx.array) else value
            if v.ndim == 3:
                # ConvTranspose1d (I, O, K) -> (O, K, I); Conv1d, filters and STFT bases (O, I, K) -> (O, K, I).
                v = v.transpose(1, 2, 0) if _is_transposed_conv(name) else v.transpose(0, 2, 1)
            out[name] = mx.array(v).astype(mx.float32)
        return out

    @staticmethod
    def pack_to_model(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Pack keys (`vocoder.` stripped) already equal ours in MLX layout; compute in float32."""
        return {k: v.astype(mx.float32) for k, v in weights.items()}


def decode_audio(decoder: AudioDecoder, vocoder: Vocoder, audio_latent: mx.array) -> tuple[np.ndarray, int]:
    """Audio latent (1, z, T, F) -> (waveform float32 (channels, samples), sample rate): VAE, vocoder, BWE."""
    mel = decoder(audio_latent)
    wave = vocoder(mel)[0].astype(mx.float32)
    mx.eval(wave)
    return np.array(wave), vocoder.sample_rate
