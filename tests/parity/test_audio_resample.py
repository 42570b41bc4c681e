"""Parity of the audio encode's resampler with torchaudio's `functional.resample`, the call
ltx_core 1.0.0's `AudioProcessor.resample_audio` makes with its defaults (windowed sinc, Hann window,
lowpass_filter_width 6, rolloff 0.99).

torchaudio is not installed: `_torchaudio_resample` below is its `_get_sinc_resample_kernel` and
`_apply_sinc_resample_kernel` written out in torch (a strided `conv1d` over the padded waveform, one
filter per output phase), as `test_audio_encoder.py` writes out its mel formulas; the farm's version is
numpy (`ltx_engine/rules/audio_resample.py`: a strided window view times the kernel).
"""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

from ltx_engine.rules.audio_resample import resample  # noqa: E402


def _torchaudio_resample(wave: "torch.Tensor", orig: int, new: int, width_lp: int = 6, rolloff: float = 0.99):
    gcd = math.gcd(orig, new)
    orig, new = orig // gcd, new // gcd
    base = min(orig, new) * rolloff
    width = math.ceil(width_lp * orig / base)
    idx = torch.arange(-width, width + orig, dtype=wave.dtype)[None, None] / orig
    t = torch.arange(0, -new, -1, dtype=wave.dtype)[:, None, None] / new + idx
    t *= base
    t = t.clamp_(-width_lp, width_lp)
    window = torch.cos(t * math.pi / width_lp / 2) ** 2
    t *= math.pi
    kernels = torch.where(t == 0, torch.tensor(1.0).to(t), t.sin() / t)
    kernels *= window * (base / orig)
    shape = wave.size()
    flat = wave.view(-1, shape[-1])
    length = flat.shape[-1]
    padded = torch.nn.functional.pad(flat, (width, width + orig))
    out = (
        torch.nn.functional.conv1d(padded[:, None], kernels, stride=orig)
        .transpose(1, 2)
        .reshape(flat.shape[0], -1)
    )
    out = out[..., : int(math.ceil(new * length / orig))]
    return out.view(*shape[:-1], out.shape[-1])


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


@pytest.mark.parametrize(("orig", "new"), [(44100, 16000), (48000, 16000), (22050, 16000), (8000, 16000)])
def test_resample_matches_torchaudio(orig, new):
    wave = np.random.default_rng(orig).standard_normal((1, 2, orig // 2 + 37)).astype(np.float32)
    want = _torchaudio_resample(torch.from_numpy(wave), orig, new).numpy()
    got = resample(wave, orig, new)
    assert got.shape == want.shape
    assert _rel(got, want) <= 1e-4
