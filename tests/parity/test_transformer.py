"""Parity of the MLX LTX-2 DiT and the patchify/position helpers with ltx_core at tiny sizes."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

import mlx.core as mx  # noqa: E402
from ltx_core.components.patchifiers import (  # noqa: E402
    AudioPatchifier,
    VideoLatentPatchifier,
    get_pixel_coords,
)
from ltx_core.model.transformer.modality import Modality as RefModality  # noqa: E402
from ltx_core.model.transformer.model_configurator import (  # noqa: E402
    LTXModelConfigurator,
    LTXVideoOnlyModelConfigurator,
)
from ltx_core.model.transformer.rope import generate_freq_grid_pytorch  # noqa: E402
from ltx_core.types import AudioLatentShape, VideoLatentShape  # noqa: E402

from ltx_engine.loading.loader import apply_weights  # noqa: E402
from ltx_engine.models import patchify as P  # noqa: E402
from ltx_engine.models.rope import _freq_grid  # noqa: E402
from ltx_engine.models.transformer import (  # noqa: E402
    VIDEO_ONLY,
    LTXModel,
    Modality,
    TransformerConfig,
    tiny_config,
)
from ltx_engine.rules import tokens as T  # noqa: E402
from tests.parity.upstream_rules import follow_ltx_core_1_2_0  # noqa: E402

FRAMES, HEIGHT, WIDTH, FPS = 3, 4, 6, 24.0
AUDIO_FRAMES, CTX_LEN = 20, 7


def _randomize(module: "torch.nn.Module", seed: int) -> None:
    """Overwrite every parameter and buffer (scale-shift tables start as torch.empty)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            r = torch.randn(t.shape, generator=g)
            if name.endswith("norm.weight"):
                t.copy_(1 + 0.1 * r)
            elif t.ndim == 2 and "scale_shift_table" not in name:
                t.copy_(r / t.shape[1] ** 0.5)
            else:
                t.copy_(0.2 * r)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def _cfg(rope_type: str, precision: str = "float64") -> dict:
    t = copy.deepcopy(tiny_config())
    t.update(rope_type=rope_type, frequencies_precision=precision)
    return {"transformer": t}


def _models(cfg: dict, video_only: bool, upstream: bool = True):
    """(reference, ours) with the same seeded weights; the reference follows ltx-core 1.2.0's
    cross-attention AdaLN rule unless `upstream` is False (then it is the installed 1.0.0 as is)."""
    conf = LTXVideoOnlyModelConfigurator if video_only else LTXModelConfigurator
    ref = conf.from_config(cfg).float().eval()
    _randomize(ref, 1)
    if upstream:
        follow_ltx_core_1_2_0(ref)
    ours = LTXModel(TransformerConfig.from_config(cfg, model_type=VIDEO_ONLY if video_only else None))
    sd = {k: v.numpy() for k, v in ref.state_dict().items()}
    apply_weights(ours, LTXModel.sanitize(sd), file="test")
    return ref, ours


def _video_inputs(rng: np.random.Generator, width: int) -> dict:
    """Two samples, generated tokens plus first-frame conditioning tokens at timestep 0."""
    b = 2
    pos = np.array(P.video_positions(b, FRAMES, HEIGHT, WIDTH, FPS))
    n_gen, n_cond = pos.shape[2], HEIGHT * WIDTH
    cond_pos = pos[:, :, :n_cond].copy()
    cond_pos[:, 0] -= 0.5  # a reference-like conditioning item at negative time
    pos = np.concatenate([pos, cond_pos], axis=2)
    sigma = np.array([0.9, 0.4], np.float32)
    ts = np.concatenate([np.repeat(sigma[:, None], n_gen, 1), np.zeros((b, n_cond), np.float32)], 1)
    mask = np.ones((b, CTX_LEN), np.int64)
    mask[1, -3:] = 0
    return dict(latent=rng.standard_normal((b, n_gen + n_cond, 128), np.float32), sigma=sigma, timesteps=ts,
                positions=pos.astype(np.float32), context=rng.standard_normal((b, CTX_LEN, width), np.float32),
                context_mask=mask)


def _audio_inputs(rng: np.random.Generator, width: int) -> dict:
    b = 2
    sigma = np.array([0.7, 0.2], np.float32)
    ts = np.repeat(sigma[:, None], AUDIO_FRAMES, 1)
    ts[:, :3] = 0.0  # some audio tokens conditioned
    return dict(latent=rng.standard_normal((b, AUDIO_FRAMES, 128), np.float32), sigma=sigma, timesteps=ts,
                positions=np.array(P.audio_positions(b, AUDIO_FRAMES)),
                context=rng.standard_normal((b, CTX_LEN, width), np.float32), context_mask=None)


def _ref_mod(d: dict | None):
    if d is None:
        return None
    t = {k: (torch.from_numpy(np.asarray(v)) if v is not None else None) for k, v in d.items()}
    return RefModality(latent=t["latent"], sigma=t["sigma"], timesteps=t["timesteps"], positions=t["positions"],
                       context=t["context"], context_mask=t["context_mask"])


def _our_mod(d: dict | None):
    if d is None:
        return None
    return Modality(**{k: (mx.array(v) if v is not None else None) for k, v in d.items()})


def _compare(ref, ours, video: dict | None, audio: dict | None) -> list[float]:
    with torch.no_grad():
        rv, ra = ref(_ref_mod(video), _ref_mod(audio), None)
    ov, oa = ours(_our_mod(video), _our_mod(audio))
    errs = []
    for r, o in ((rv, ov), (ra, oa)):
        assert (r is None) == (o is None)
        if r is not None:
            errs.append(_rel(np.array(o), r.numpy()))
    return errs


# RoPE angles reach ~1.5e4 rad and torch's float32 cos/sin is only ~1.5e-4 accurate there (MLX's is
# ~1e-7), so part of the measured error is the reference's own; it stays well under 1e-4 here.
@pytest.mark.parametrize("rope_type", ["split", "interleaved"])
def test_av_transformer(rope_type):
    cfg = _cfg(rope_type)
    ref, ours = _models(cfg, video_only=False)
    t = cfg["transformer"]
    rng = np.random.default_rng(0)
    video = _video_inputs(rng, t["cross_attention_dim"])
    audio = _audio_inputs(rng, t["audio_cross_attention_dim"])
    errs = _compare(ref, ours, video, audio)
    print("av", rope_type, errs)
    assert len(errs) == 2 and max(errs) <= 1e-4
    # Each modality alone through the AV model (no cross-attention, as the reference does).
    assert max(_compare(ref, ours, video, None)) <= 1e-4
    assert max(_compare(ref, ours, None, audio)) <= 1e-4


def _conditioned_and_frozen(rng: np.random.Generator, t: dict) -> tuple[dict, dict]:
    """Video with its first latent frame conditioned in place (denoise mask 0 on those tokens) plus
    appended conditioning tokens, and frozen audio (timesteps 0 and sigma 0) while video sigma > 0:
    where ltx-core 1.0.0 and 1.2.0 feed the cross-attention scale/shift different timesteps."""
    video = _video_inputs(rng, t["cross_attention_dim"])
    video["timesteps"][:, : HEIGHT * WIDTH] = 0.0
    audio = _audio_inputs(rng, t["audio_cross_attention_dim"])
    audio["sigma"] = np.zeros_like(audio["sigma"])
    audio["timesteps"] = np.zeros_like(audio["timesteps"])
    return video, audio


@pytest.mark.parametrize("rope_type", ["split", "interleaved"])
def test_av_cross_attention_adaln_follows_1_2_0(rope_type):
    cfg = _cfg(rope_type)
    ref, ours = _models(cfg, video_only=False)
    old, _ = _models(cfg, video_only=False, upstream=False)
    video, audio = _conditioned_and_frozen(np.random.default_rng(4), cfg["transformer"])
    errs = _compare(ref, ours, video, audio)
    with torch.no_grad():
        new_out = ref(_ref_mod(video), _ref_mod(audio), None)
        old_out = old(_ref_mod(video), _ref_mod(audio), None)
    rule_gap = [_rel(o.numpy(), n.numpy()) for o, n in zip(old_out, new_out, strict=True)]
    print("1.2.0 rule", rope_type, "ours vs 1.2.0", errs, "1.0.0 vs 1.2.0", rule_gap)
    assert min(rule_gap) > 1e-2  # the case really tells the two rules apart, in both streams
    assert len(errs) == 2 and max(errs) <= 1e-4


# Video heads != audio heads. Both AV attentions run in the audio head layout; the reference cuts the
# audio-width q/k into the modality's own head count for the SPLIT rotation (video side: video heads).
ASYMMETRIC_HEADS = {
    "video_more_heads": dict(num_attention_heads=4, attention_head_dim=16,
                             audio_num_attention_heads=2, audio_attention_head_dim=16),
    "audio_more_heads": dict(num_attention_heads=2, attention_head_dim=32,
                             audio_num_attention_heads=4, audio_attention_head_dim=8),
}


@pytest.mark.parametrize("heads", list(ASYMMETRIC_HEADS))
@pytest.mark.parametrize("rope_type", ["split", "interleaved"])
def test_av_transformer_asymmetric_heads(heads, rope_type):
    cfg = _cfg(rope_type)
    cfg["transformer"].update(ASYMMETRIC_HEADS[heads])
    t = cfg["transformer"]
    assert t["audio_cross_attention_dim"] == t["audio_num_attention_heads"] * t["audio_attention_head_dim"]
    ref, ours = _models(cfg, video_only=False)
    video, audio = _conditioned_and_frozen(np.random.default_rng(5), t)
    errs = _compare(ref, ours, video, audio)
    print("asymmetric", heads, rope_type, errs)
    assert len(errs) == 2 and max(errs) <= 1e-4


@pytest.mark.parametrize("rope_type,precision", [("split", "float64"), ("interleaved", "float32")])
def test_video_only_transformer(rope_type, precision):
    cfg = _cfg(rope_type, precision)
    cfg["transformer"].update(cross_attention_adaln=False, apply_gated_attention=False)  # the 2.0 layout
    ref, ours = _models(cfg, video_only=True)
    rng = np.random.default_rng(1)
    errs = _compare(ref, ours, _video_inputs(rng, cfg["transformer"]["cross_attention_dim"]), None)
    print("video", rope_type, errs)
    assert max(errs) <= 1e-4


def test_from_weights_switches():
    cfg = _cfg("split")
    _, ours = _models(cfg, video_only=False)
    from mlx.utils import tree_flatten

    weights = {f"transformer.{k}": v for k, v in tree_flatten(ours.parameters())}
    plain = {"transformer": {"num_attention_heads": 2, "attention_head_dim": 32}}
    c = TransformerConfig.from_weights(plain, weights)
    assert c.cross_attention_adaln and c.apply_gated_attention and c.num_layers == 2
    assert c.model_type == "AudioVideo" and c.caption_channels is None
    video_only = {k: v for k, v in weights.items() if "audio" not in k and "av_ca" not in k}
    assert TransformerConfig.from_weights(plain, video_only).model_type == VIDEO_ONLY


def test_float32_freq_grid_matches_torch():
    for n_axes, dim in ((3, 4096), (1, 2048), (3, 64)):
        ref = generate_freq_grid_pytorch(10000.0, n_axes, dim).numpy()
        ours = _freq_grid(10000.0, n_axes, dim, False)
        np.testing.assert_allclose(ours, ref, rtol=2e-7)


@pytest.mark.parametrize("fps", [24.0, 23.976, 25.0])
def test_video_patchify_and_positions(fps):
    shape = VideoLatentShape(batch=2, channels=8, frames=3, height=4, width=5)
    patchifier = VideoLatentPatchifier(patch_size=1)
    lat = torch.randn(2, 8, 3, 4, 5)
    tokens = patchifier.patchify(lat)
    ours = T.patchify_video(lat.numpy())
    np.testing.assert_array_equal(ours, tokens.numpy())
    np.testing.assert_array_equal(T.unpatchify_video(ours, (3, 4, 5)), lat.numpy())
    ref = get_pixel_coords(patchifier.get_patch_grid_bounds(shape), (8, 32, 32), causal_fix=True).float()
    ref[:, 0, ...] = ref[:, 0, ...] / fps
    pos = P.video_positions(2, 3, 4, 5, fps)
    assert pos.dtype == mx.float32
    np.testing.assert_array_equal(np.array(pos), ref.numpy())


def test_audio_patchify_and_positions():
    shape = AudioLatentShape(batch=2, channels=8, frames=11, mel_bins=16)
    patchifier = AudioPatchifier(patch_size=1)
    lat = torch.randn(2, 8, 11, 16)
    tokens = patchifier.patchify(lat)
    ours = T.patchify_audio(lat.numpy())
    np.testing.assert_array_equal(ours, tokens.numpy())
    np.testing.assert_array_equal(T.unpatchify_audio(ours, 8), lat.numpy())
    ref = patchifier.get_patch_grid_bounds(shape)
    np.testing.assert_array_equal(np.array(P.audio_positions(2, 11)), ref.numpy())
