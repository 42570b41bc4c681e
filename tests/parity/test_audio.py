"""Parity of the MLX audio VAE decoder, vocoder and bandwidth extension with ltx_core at tiny sizes."""

import copy
import importlib.util
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

_STANDIN = "torchaudio" not in sys.modules and importlib.util.find_spec("torchaudio") is None
if _STANDIN:
    # ltx_core imports torchaudio only for the encoder's waveform->mel transform, unused here. The
    # stand-in lives only while ltx_core's audio modules import, so other tests see no torchaudio.
    sys.modules["torchaudio"] = types.ModuleType("torchaudio")

import mlx.core as mx  # noqa: E402
from ltx_core.model.audio_vae.model_configurator import (  # noqa: E402
    AudioDecoderConfigurator,
    VocoderConfigurator,
)

if _STANDIN:
    del sys.modules["torchaudio"]

from ltx_engine.loading.loader import apply_weights  # noqa: E402
from ltx_engine.models.audio_vae import AudioDecoder, tiny_config  # noqa: E402


def _randomize(module: "torch.nn.Module", seed: int, scale: float = 0.2) -> None:
    """Overwrite every saved parameter and buffer (several reference tensors start as torch.empty).

    Non-persistent buffers (the BWE resampler's fixed sinc filter) are not in a checkpoint, so they stay.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in module.state_dict(keep_vars=True).values():
            t.copy_(torch.randn(t.shape, generator=g) * scale)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def _audio_cfg(**dd) -> dict:
    cfg = copy.deepcopy(tiny_config())
    cfg["audio_vae"]["model"]["params"]["ddconfig"].update(dd)
    return cfg


# The reference sizes its statistics by `ch`, so parity configs keep ch == z_channels * latent mel bins.
DECODER_CASES = {
    "causal_pixel": _audio_cfg(ch=16, z_channels=2, mel_bins=32),
    "attention": _audio_cfg(ch=16, ch_mult=[1, 2], z_channels=1, mel_bins=32, attn_resolutions=[128, 256],
                            mid_block_add_attention=True),
    "group_noncausal": _audio_cfg(ch=32, ch_mult=[1, 2], z_channels=2, mel_bins=32, norm_type="group",
                                  causality_axis=None, mid_block_add_attention=True),
    "width_causal": _audio_cfg(ch=16, z_channels=2, mel_bins=32, causality_axis="width"),
}


@pytest.mark.parametrize("name", sorted(DECODER_CASES))
def test_audio_decoder(name):
    cfg = DECODER_CASES[name]
    ref = AudioDecoderConfigurator.from_config(cfg).float().eval()
    _randomize(ref, 0)
    with torch.no_grad():  # keep the std positive-ish like real statistics
        ref.per_channel_statistics.get_buffer("std-of-means").abs_().add_(0.5)
    ours = AudioDecoder.from_config(cfg)
    sd = {f"decoder.{k}" if not k.startswith("per_channel") else k: v.numpy() for k, v in ref.state_dict().items()}
    apply_weights(ours, AudioDecoder.sanitize(sd), file="test")
    z = ours.config.z_channels
    f = ours.config.stats_channels // z
    x = torch.randn(1, z, 7, f, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(x).numpy()
    got = np.array(ours(mx.array(x.numpy())))
    assert got.shape == want.shape
    assert _rel(got, want) <= 1e-4, _rel(got, want)


def test_tiny_decoder_shapes_and_pack_roundtrip():
    dec = AudioDecoder.from_config(tiny_config())
    from mlx.utils import tree_flatten

    params = dict(tree_flatten(dec.parameters()))
    packed = AudioDecoder.model_to_pack(params)
    assert "per_channel_statistics._mean_of_means" in packed and "decoder.conv_in.conv.weight" in packed
    packed["encoder.conv_in.conv.weight"] = mx.zeros((1,))  # encoder keys share the file and are skipped
    apply_weights(AudioDecoder.from_config(tiny_config()), AudioDecoder.pack_to_model(packed), file="t")
    out = dec(mx.random.normal((1, 8, 25, 16)))
    assert out.shape == (1, 2, 97, 64)


from ltx_core.model.audio_vae.vocoder import MelSTFT as RefMelSTFT  # noqa: E402

from ltx_engine.models.vocoder import MelSTFT, Vocoder, decode_audio  # noqa: E402
from ltx_engine.models.vocoder import tiny_config as tiny_vocoder_config  # noqa: E402


def _vocoder_pair(cfg: dict, seed: int):
    ref = VocoderConfigurator.from_config(cfg).float().eval()
    _randomize(ref, seed, scale=0.1)
    ours = Vocoder.from_config(cfg)
    apply_weights(ours, Vocoder.sanitize({k: v.numpy() for k, v in ref.state_dict().items()}), file="test")
    return ref, ours


def test_vocoder_with_bwe():
    ref, ours = _vocoder_pair(tiny_vocoder_config(), 5)
    mel = torch.randn(1, 2, 9, 64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = ref(mel).numpy()
    got = np.array(ours(mx.array(mel.numpy())))
    assert got.shape == want.shape == (1, 2, 9 * 160 * 3)
    assert ours.sample_rate == ref.output_sampling_rate == 48000
    assert _rel(got, want) <= 1e-4, _rel(got, want)


def test_base_generator_without_bwe_section():
    # The flat LTX-2 section: HiFi-GAN ResBlock1, leaky ReLU, tanh at the end.
    cfg = {"vocoder": {"upsample_initial_channel": 32, "resblock": "1", "stereo": True,
                       "upsample_rates": [4, 2], "upsample_kernel_sizes": [8, 4],
                       "resblock_kernel_sizes": [3, 5], "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]],
                       "output_sampling_rate": 24000}}
    ref, ours = _vocoder_pair(cfg, 7)
    mel = torch.randn(1, 2, 11, 64, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        want = ref(mel).numpy()
    got = np.array(ours(mx.array(mel.numpy())))
    assert got.shape == want.shape and ours.sample_rate == 24000
    assert _rel(got, want) <= 1e-4, _rel(got, want)


def test_mel_stft():
    ref = RefMelSTFT(512, 80, 512, 64).float()
    _randomize(ref, 9)
    ref.mel_basis.abs_()
    ours = MelSTFT(512, 80, 64)
    sd = {f"mel_stft.{k}": v.numpy() for k, v in ref.state_dict().items()}
    apply_weights(ours, {k.removeprefix("mel_stft."): v for k, v in Vocoder.sanitize(sd).items()}, file="t")
    y = torch.randn(2, 800, generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        want = ref.mel_spectrogram(y)[0].transpose(1, 2).numpy()
    got = np.array(ours(mx.array(y.numpy())))
    assert _rel(got, want) <= 1e-4, _rel(got, want)


def test_decode_audio_tiny_chain():
    dec = AudioDecoder.from_config(tiny_config())
    voc = Vocoder.from_config(tiny_vocoder_config())
    wave, sr = decode_audio(dec, voc, mx.random.normal((1, 8, 6, 16), key=mx.random.key(0)))
    assert sr == 48000
    assert wave.dtype == np.float32 and wave.shape == (2, (6 * 4 - 3) * 160 * 3)
    assert np.all(np.abs(wave) <= 1.0)
