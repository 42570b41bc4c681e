"""Parity of the MLX latent upsamplers with ltx_core's LatentUpsampler at tiny sizes."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

import mlx.core as mx  # noqa: E402
from ltx_core.model.upsampler import LatentUpsamplerConfigurator, upsample_video  # noqa: E402

from ltx_engine.loading.loader import apply_weights  # noqa: E402
from ltx_engine.models.upsampler import (  # noqa: E402
    LatentUpsampler,
    tiny_spatial_config,
    tiny_temporal_config,
    upsample_latent,
)


def _randomize(module: "torch.nn.Module", seed: int) -> None:
    """Overwrite every parameter and buffer (several reference tensors start as torch.empty)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, t in list(module.named_parameters()) + list(module.named_buffers()):
            t.copy_(torch.randn(t.shape, generator=g) * 0.2)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def _pair(cfg: dict, seed: int):
    ref = LatentUpsamplerConfigurator.from_config(cfg["config"]).float().eval()
    _randomize(ref, seed)
    ours = LatentUpsampler.from_config(cfg)
    sd = {k: v.numpy() for k, v in ref.state_dict().items()}
    apply_weights(ours, LatentUpsampler.sanitize(sd), file="test")
    return ref, ours


def _case(cfg: dict, shape: tuple, seed: int) -> float:
    ref, ours = _pair(cfg, seed)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        want = ref(x).numpy()
    got = np.array(ours(mx.array(x.numpy())))
    assert got.shape == want.shape
    return _rel(got, want)


def test_spatial_x2():
    err = _case(tiny_spatial_config(), (1, 128, 3, 6, 5), 0)
    assert err <= 1e-4, err


def test_temporal_x2():
    err = _case(tiny_temporal_config(), (1, 128, 3, 4, 5), 1)
    assert err <= 1e-4, err


@pytest.mark.parametrize(
    "extra",
    [
        {"rational_resampler": True, "spatial_scale": 1.5},
        {"spatial_upsample": True, "temporal_upsample": True},
        {"dims": 2},
    ],
)
def test_other_variants(extra):
    cfg = tiny_spatial_config()
    cfg["config"].update(extra, num_blocks_per_stage=1)
    err = _case(cfg, (1, 128, 2, 6, 4), 2)
    assert err <= 1e-4, err


def test_upsample_latent_matches_upsample_video():
    cfg = tiny_spatial_config()
    ref, ours = _pair(cfg, 3)
    g = torch.Generator().manual_seed(4)
    mean, std = torch.randn(128, generator=g), torch.rand(128, generator=g) + 0.5

    class _Stats:
        def un_normalize(self, x):
            return x * std[None, :, None, None, None] + mean[None, :, None, None, None]

        def normalize(self, x):
            return (x - mean[None, :, None, None, None]) / std[None, :, None, None, None]

    class _Encoder:
        per_channel_statistics = _Stats()

    x = torch.randn(1, 128, 2, 4, 4, generator=g)
    with torch.no_grad():
        want = upsample_video(x, _Encoder(), ref).numpy()
    got = np.array(upsample_latent(ours, mx.array(x.numpy()), mx.array(mean.numpy()), mx.array(std.numpy())))
    assert _rel(got, want) <= 1e-4
