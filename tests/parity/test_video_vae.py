"""Parity of the MLX video VAE with ltx_core's reference at tiny configs (float32)."""

from __future__ import annotations

import copy
from unittest import mock

import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from ltx_core.model.video_vae.model_configurator import (  # noqa: E402
    VideoDecoderConfigurator,
    VideoEncoderConfigurator,
)

from ltx_engine.loading.loader import apply_weights  # noqa: E402
from ltx_engine.models.video_vae import (  # noqa: E402
    VideoDecoder,
    VideoEncoder,
    VideoVAEConfig,
    tiny_config,
)

TOL = 1e-4


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter and buffer (several are torch.empty in the reference)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            if "std-of-means" in name:
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=gen))
            elif "timestep_scale_multiplier" in name:
                tensor.fill_(1000.0)
            else:
                fan_in = max(1, tensor[0].numel()) if tensor.ndim > 1 else 4
                tensor.copy_(torch.randn(tensor.shape, generator=gen) / fan_in**0.5)


def _state(module: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().float().numpy() for k, v in module.state_dict().items()}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def _decoder_pair(vae: dict, seed: int = 0):
    ref = VideoDecoderConfigurator.from_config({"vae": vae}).eval()
    _randomize(ref, seed)
    ours = VideoDecoder(VideoVAEConfig.from_config({"vae": vae}))
    apply_weights(ours, VideoDecoder.sanitize(_state(ref)), file="ref-decoder")
    return ref, ours


def _encoder_pair(vae: dict, seed: int = 1):
    ref = VideoEncoderConfigurator.from_config({"vae": vae}).eval()
    _randomize(ref, seed)
    ours = VideoEncoder(VideoVAEConfig.from_config({"vae": vae}))
    apply_weights(ours, VideoEncoder.sanitize(_state(ref)), file="ref-encoder")
    return ref, ours


def _latent(shape, seed=2) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_decoder_parity_multi_frame():
    ref, ours = _decoder_pair(tiny_config())
    z = _latent((1, 128, 3, 2, 3))
    with torch.no_grad():
        want = ref(torch.from_numpy(z)).numpy()
    got = np.array(ours(mx.array(z)))
    assert got.shape == want.shape == (1, 3, 17, 64, 96)
    assert _rel(got, want) <= TOL


def test_decoder_parity_causal_reflect_timestep_groupnorm():
    vae = copy.deepcopy(tiny_config())
    vae.update(
        causal_decoder=True,
        spatial_padding_mode="reflect",
        timestep_conditioning=True,
        norm_layer="group_norm",
        decoder_base_channels=8,  # group norm needs widths divisible by its 32 groups
    )
    vae["decoder_blocks"] = [
        ["res_x", {"num_layers": 1}],
        ["compress_space", {"multiplier": 1}],
        ["res_x_y", {"multiplier": 2}],
        ["compress_time", {"multiplier": 1}],
        ["res_x", {"num_layers": 2}],
        ["compress_all", {"multiplier": 1, "residual": True}],
        ["res_x", {"num_layers": 1}],
        ["compress_all", {"multiplier": 1}],
        ["res_x", {"num_layers": 1}],
    ]
    ref, ours = _decoder_pair(vae, seed=3)
    z = _latent((2, 128, 2, 2, 3), seed=4)
    noise = _latent(z.shape, seed=5)
    with torch.no_grad(), mock.patch("torch.randn", lambda *a, **k: torch.from_numpy(noise)):
        want = ref(torch.from_numpy(z), timestep=torch.tensor([0.05, 0.3])).numpy()
    got = np.array(ours(mx.array(z), mx.array([0.05, 0.3]), noise=mx.array(noise)))
    assert got.shape == want.shape
    assert _rel(got, want) <= TOL


def test_decoder_is_causal_in_time():
    vae = dict(tiny_config(), causal_decoder=True)
    _, ours = _decoder_pair(vae)
    z = _latent((1, 128, 3, 1, 1))
    z2 = z.copy()
    z2[:, :, 2] += 1.0
    a, b = np.array(ours(mx.array(z))), np.array(ours(mx.array(z2)))
    assert np.allclose(a[:, :, :9], b[:, :, :9], atol=1e-6)  # frames of latents 0..1 unchanged
    assert not np.allclose(a[:, :, 9:], b[:, :, 9:])


def test_encoder_parity_multi_frame():
    ref, ours = _encoder_pair(tiny_config())
    x = np.tanh(_latent((1, 3, 17, 64, 96), seed=6))
    with torch.no_grad():
        want = ref(torch.from_numpy(x)).numpy()
    got = np.array(ours(mx.array(x)))
    assert got.shape == want.shape == (1, 128, 3, 2, 3)
    assert _rel(got, want) <= TOL


def test_encoder_parity_other_blocks_and_crop():
    vae = copy.deepcopy(tiny_config())
    vae.update(latent_log_var="per_channel", spatial_padding_mode="replicate")
    vae["encoder_blocks"] = [
        ["compress_space", {}],
        ["compress_time_res", {"multiplier": 1}],
        ["res_x_y", {"multiplier": 1}],
        ["compress_all_x_y", {"multiplier": 1}],
        ["compress_all_res", {"multiplier": 2}],
        ["res_x", 1],
    ]
    ref, ours = _encoder_pair(vae, seed=7)
    x = np.tanh(_latent((1, 3, 11, 32, 64), seed=8))  # 11 frames: cropped to 9
    with torch.no_grad():
        want = ref(torch.from_numpy(x)).numpy()
    got = np.array(ours(mx.array(x)))
    assert got.shape == want.shape == (1, 128, 2, 1, 2)
    assert _rel(got, want) <= TOL


def test_pack_key_renames_round_trip():
    ref, ours = _encoder_pair(tiny_config())
    model_keys = VideoEncoder.sanitize(_state(ref))
    pack = VideoEncoder.model_to_pack(model_keys)
    assert "per_channel_statistics._mean_of_means" in pack
    assert "per_channel_statistics._std_of_means" in pack
    assert VideoEncoder.pack_to_model(pack).keys() == model_keys.keys()
    dec = VideoDecoder.sanitize(_state(VideoDecoderConfigurator.from_config({"vae": tiny_config()})))
    assert {"per_channel_statistics.mean", "per_channel_statistics.std"} <= dec.keys()
    assert VideoDecoder.pack_to_model(VideoDecoder.model_to_pack(dec)).keys() == dec.keys()
