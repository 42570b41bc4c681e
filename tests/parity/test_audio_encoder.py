"""Parity of the MLX audio VAE encoder and its log-mel front end with ltx_core 1.0.0 at tiny sizes.

torchaudio is not installed, and ltx_core imports it only for `AudioProcessor` (a torchaudio
`MelSpectrogram`). The encoder's reference is ltx_core's own `AudioEncoder`, imported with an empty
torchaudio stand-in; the mel reference is `_torchaudio_mel` below: torchaudio's `MelSpectrogram`
formulas (`melscale_fbanks` with Slaney scale and norm, `Spectrogram` via `torch.stft`) written out in
torch with the arguments `AudioProcessor` passes, followed by its `log(clamp(., 1e-5))` and permute.
"""

import copy
import importlib.util
import math
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

_STANDIN = "torchaudio" not in sys.modules and importlib.util.find_spec("torchaudio") is None
if _STANDIN:
    sys.modules["torchaudio"] = types.ModuleType("torchaudio")

import mlx.core as mx  # noqa: E402
from ltx_core.model.audio_vae.model_configurator import AudioEncoderConfigurator  # noqa: E402

if _STANDIN:
    del sys.modules["torchaudio"]

from mlx.utils import tree_flatten  # noqa: E402

from ltx_engine.loading.loader import apply_weights  # noqa: E402
from ltx_engine.models.audio_encoder import AudioEncoder  # noqa: E402
from ltx_engine.models.audio_mel import MelConfig, log_mel  # noqa: E402
from ltx_engine.models.audio_vae import tiny_config  # noqa: E402


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def _randomize(module: "torch.nn.Module", seed: int, scale: float = 0.2) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in module.state_dict(keep_vars=True).values():
            t.copy_(torch.randn(t.shape, generator=g) * scale)


def _audio_cfg(**dd) -> dict:
    cfg = copy.deepcopy(tiny_config())
    cfg["audio_vae"]["model"]["params"]["ddconfig"].update(dd)
    return cfg


# The reference sizes its statistics by `ch`, so parity configs keep ch == z_channels * latent mel bins.
ENCODER_CASES = {
    "causal_pixel": _audio_cfg(ch=16, z_channels=2, mel_bins=32),
    "two_blocks": _audio_cfg(ch=16, z_channels=2, mel_bins=32, num_res_blocks=2),
    "attention": _audio_cfg(ch=16, ch_mult=[1, 2], z_channels=1, mel_bins=32, attn_resolutions=[128, 256],
                            mid_block_add_attention=True),
    "group_noncausal": _audio_cfg(ch=32, ch_mult=[1, 2], z_channels=2, mel_bins=32, norm_type="group",
                                  causality_axis=None, mid_block_add_attention=True),
    "width_causal": _audio_cfg(ch=16, z_channels=2, mel_bins=32, causality_axis="width"),
}


@pytest.mark.parametrize("name", sorted(ENCODER_CASES))
def test_audio_encoder(name):
    cfg = ENCODER_CASES[name]
    ref = AudioEncoderConfigurator.from_config(cfg).float().eval()
    _randomize(ref, 0)
    with torch.no_grad():
        ref.per_channel_statistics.get_buffer("std-of-means").abs_().add_(0.5)
    ours = AudioEncoder.from_config(cfg)
    sd = {k if k.startswith("per_channel") else f"encoder.{k}": v.numpy() for k, v in ref.state_dict().items()}
    apply_weights(ours, AudioEncoder.sanitize(sd), file="test")
    mel = torch.randn(1, 2, 29, ours.config.mel_bins, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(mel).numpy()
    got = np.array(ours(mx.array(mel.numpy())))
    assert got.shape == want.shape
    assert _rel(got, want) <= 1e-4


# ---- the mel reference: torchaudio's formulas as AudioProcessor calls them ----

def _hz_to_mel_slaney(freq: float) -> float:
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    if freq < min_log_hz:
        return freq / f_sp
    return min_log_hz / f_sp + math.log(freq / min_log_hz) / (math.log(6.4) / 27.0)


def _mel_to_hz_slaney(mels: "torch.Tensor") -> "torch.Tensor":
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0
    freqs = f_sp * mels
    high = mels >= min_log_mel
    freqs[high] = min_log_hz * torch.exp(logstep * (mels[high] - min_log_mel))
    return freqs


def _melscale_fbanks(n_freqs: int, sample_rate: int, n_mels: int) -> "torch.Tensor":
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    m_pts = torch.linspace(_hz_to_mel_slaney(0.0), _hz_to_mel_slaney(sample_rate / 2.0), n_mels + 2)
    f_pts = _mel_to_hz_slaney(m_pts)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)
    down = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    fb = torch.max(torch.zeros(1), torch.min(down, up))
    enorm = 2.0 / (f_pts[2 : n_mels + 2] - f_pts[:n_mels])
    return fb * enorm.unsqueeze(0)


def _torchaudio_mel(wave: "torch.Tensor", cfg: MelConfig) -> "torch.Tensor":
    shape = wave.shape
    flat = wave.reshape(-1, shape[-1])
    spec = torch.stft(flat, n_fft=cfg.n_fft, hop_length=cfg.hop_length, win_length=cfg.n_fft,
                      window=torch.hann_window(cfg.n_fft), center=True, pad_mode="reflect",
                      normalized=False, onesided=True, return_complex=True).abs().pow(1.0)
    spec = spec.reshape(shape[:-1] + spec.shape[-2:])
    fb = _melscale_fbanks(cfg.n_fft // 2 + 1, cfg.sample_rate, cfg.mel_bins)
    mel = torch.matmul(spec.transpose(-1, -2), fb).transpose(-1, -2)
    mel = torch.log(torch.clamp(mel, min=1e-5))
    return mel.permute(0, 1, 3, 2).contiguous()


@pytest.mark.parametrize("n_fft,hop,bins,samples", [(1024, 160, 64, 16000), (512, 128, 32, 5000), (256, 64, 16, 1001)])
def test_log_mel(n_fft, hop, bins, samples):
    cfg = MelConfig(16000, n_fft, hop, bins)
    g = torch.Generator().manual_seed(2)
    t = torch.arange(samples) / 16000.0
    wave = 0.3 * torch.randn(2, 2, samples, generator=g) + 0.5 * torch.sin(2 * math.pi * 440.0 * t)
    wave[1, 1, : samples // 3] = 0.0  # a silent stretch takes the log floor
    want = _torchaudio_mel(wave, cfg).numpy()
    got = np.array(log_mel(mx.array(wave.numpy()), cfg))
    assert got.shape == want.shape
    assert _rel(got, want) <= 1e-4


def test_encode_waveform_equals_reference_chain():
    """`encode_waveform` = reference encoder over the reference mel, the full upstream `encode_audio`."""
    cfg = ENCODER_CASES["causal_pixel"]
    ref = AudioEncoderConfigurator.from_config(cfg).float().eval()
    _randomize(ref, 3)
    with torch.no_grad():
        ref.per_channel_statistics.get_buffer("std-of-means").abs_().add_(0.5)
    ours = AudioEncoder.from_config(cfg)
    sd = {k if k.startswith("per_channel") else f"encoder.{k}": v.numpy() for k, v in ref.state_dict().items()}
    apply_weights(ours, AudioEncoder.sanitize(sd), file="test")
    wave = 0.2 * torch.randn(1, 2, 8000, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = ref(_torchaudio_mel(wave, ours.config.mel)).numpy()
    got = np.array(ours.encode_waveform(mx.array(wave.numpy())))
    assert _rel(got, want) <= 1e-4


def test_tiny_pack_carries_the_encoder(tmp_path):
    """The tiny pack's audio_vae file loads strictly into the encoder, and encodes to the latent's shape."""
    from ltx_engine.tiny.tiny_pack import tiny_embedded_config, write_tiny_pack

    pack = write_tiny_pack(tmp_path / "tiny", seed=0)
    raw = mx.load(str(pack / "audio_vae.safetensors"))
    weights = AudioEncoder.pack_to_model({k.removeprefix("audio_vae."): v for k, v in raw.items()})
    enc = apply_weights(AudioEncoder.from_config(tiny_embedded_config()), weights, file="audio_vae.safetensors")
    assert len(dict(tree_flatten(enc.parameters()))) == len(weights)
    latent = enc.encode_waveform(mx.zeros((1, 2, 16000)) + 0.1)
    assert latent.shape == (1, 8, 26, 16)  # 101 mel frames -> 26 latent frames, 64 mel bins -> 16
    assert bool(mx.all(mx.isfinite(latent)).item())
