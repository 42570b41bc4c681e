"""LTX-2.5's diffusion video decoder (`vae_decoder_av`) against the reference, float32.

ltx-core 1.0.0 (the installed reference) has no diffusion decoder, so `_reference_decode` below is
upstream's `DiffusionVideoDecoder.forward` (ltx-core after 1.2.0: `model/video_vae/diffusion_video_decoder.py`,
`diffusion_tiling.py`, `transformer/{blocks,layers,rope_math,combined/*}.py`, the eager NATTEN fallback's
window rule) written out in torch from that code: the size floor, the trailing ghost frames and their
crop, NA blocks with absolute RoPE, the pixel-shuffle upsamples, the AdaLN-Zero diffusion blocks and the
Euler loop. What 1.0.0 does have is used as is: `PixArtAlphaCombinedTimestepSizeEmbeddings`,
`patchify` / `unpatchify`. The attention is computed differently from ours (per query frame, masked
SDPA over the window's frames) so the window rule is checked, not copied. Weights: seeded draws in
the pack's key layout, split into upstream's names the way upstream's loader does (fused qkv rows).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the reference (the parity extra): tests/needs.py's CI rule
pytest.importorskip("ltx_core")

import torch.nn.functional as F  # noqa: E402
from ltx_core.model.transformer.timestep_embedding import PixArtAlphaCombinedTimestepSizeEmbeddings  # noqa: E402
from ltx_core.model.video_vae.ops import patchify, unpatchify  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

from ltx_engine.models.diffusion_decoder import DiffusionVideoDecoder, tiny_config  # noqa: E402
from ltx_engine.rules.diffusion_tiling import min_latent_shape  # noqa: E402

CFG = tiny_config()


def _seeded_model(seed: int = 3) -> tuple[DiffusionVideoDecoder, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    model = DiffusionVideoDecoder(CFG)
    params = {}
    for key, value in tree_flatten(model.parameters()):
        shape = value.shape
        scale = 1.0 / np.sqrt(shape[-1]) if len(shape) == 2 else 0.3
        drawn = rng.standard_normal(shape) * scale
        if key.endswith(
            ("norm1.weight", "norm2.weight", "norm_out.weight", "q_norm.weight", "k_norm.weight")
        ):
            drawn = 1.0 + 0.2 * drawn
        if key.endswith("per_channel_statistics.std"):
            drawn = 1.0 + 0.5 * np.abs(drawn)
        params[key] = drawn.astype(np.float32)
    model.update(tree_unflatten([(k, mx.array(v)) for k, v in params.items()]))
    return model, params


def _upstream_names(pack: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Upstream's loader renames: fused qkv split in rows, t_embedder.mlp.{0,2} -> timestep_embedder."""
    out = {}
    for key, value in pack.items():
        t = torch.from_numpy(value)
        if key.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            leaf = key.rsplit(".", 1)[1]
            base = key[: -len(f"qkv.{leaf}")]
            for name, part in zip(("to_q", "to_k", "to_v"), torch.chunk(t, 3, dim=0), strict=True):
                out[f"{base}qkv.{name}.{leaf}"] = part
        elif key.startswith("t_embedder.mlp."):
            layer = {"0": "linear_1", "2": "linear_2"}[key.split(".")[2]]
            out[f"t_embedder.timestep_embedder.{layer}.{key.rsplit('.', 1)[1]}"] = t
        else:
            out[key] = t
    return out


# ---- upstream's formulas, in torch ----


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _lin(sd, name, x):
    return F.linear(x, sd[f"{name}.weight"], sd.get(f"{name}.bias"))


def _rope(x, split):
    """rope_math.rot_abs_axis_impl over (T, H, W) chunks, positions arange per axis."""
    parts, start = [], 0
    for axis, d in zip((1, 2, 3), split, strict=True):
        xc = x[..., start : start + d]
        inv = (
            1.0
            / torch.pow(
                torch.tensor(10000.0, dtype=torch.float64), torch.arange(0, d, 2, dtype=torch.float64) / d
            ).float()
        )
        pos = torch.arange(x.shape[axis], dtype=torch.float32)
        shape = [1, 1, 1, 1, 1, d // 2]
        shape[axis] = pos.shape[0]
        ang = (pos[:, None] * inv[None, :]).reshape(shape)
        xe, xo = xc[..., 0::2], xc[..., 1::2]
        parts.append(
            torch.stack([xe * ang.cos() - xo * ang.sin(), xe * ang.sin() + xo * ang.cos()], -1).reshape(
                xc.shape
            )
        )
        start += d
    return torch.cat(parts, -1)


def _bounds(length, kernel):
    k = min(kernel, length)
    starts = [min(max(i - k // 2, 0), length - k) for i in range(length)]
    return starts, k


def _na(q, k, v, kernel):
    """NATTEN na3d (eager fallback semantics): per query frame, masked SDPA over its window's frames."""
    b, t, h, w, nh, d = q.shape
    (st, kt), (sh, kh), (sw, kw) = _bounds(t, kernel[0]), _bounds(h, kernel[1]), _bounds(w, kernel[2])
    hv = torch.tensor([[sh[i] <= j < sh[i] + kh for j in range(h)] for i in range(h)])
    wv = torch.tensor([[sw[i] <= j < sw[i] + kw for j in range(w)] for i in range(w)])
    visible = (hv[:, None, :, None] & wv[None, :, None, :]).reshape(h * w, h * w).repeat(1, kt)
    mask = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)
    out = torch.empty_like(q)
    for ti in range(t):
        qs = q[:, ti].reshape(b, h * w, nh, d).transpose(1, 2)
        ks = k[:, st[ti] : st[ti] + kt].reshape(b, kt * h * w, nh, d).transpose(1, 2)
        vs = v[:, st[ti] : st[ti] + kt].reshape(b, kt * h * w, nh, d).transpose(1, 2)
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=1.0)
        out[:, ti] = o.transpose(1, 2).reshape(b, h, w, nh, d)
    return out


def _attention(sd, p, x, kernel):
    b, t, h, w, c = x.shape
    hd = CFG.head_dim
    q, k, v = (_lin(sd, f"{p}.attn.qkv.to_{n}", x).view(b, t, h, w, c // hd, hd) for n in "qkv")
    q = _rms(q, sd[f"{p}.attn.q_norm.weight"]) * hd**-0.5
    k = _rms(k, sd[f"{p}.attn.k_norm.weight"])
    split = (4, 6, 6)  # rope_math.default_rope_dim_split(16)
    out = _na(_rope(q, split), _rope(k, split), v, kernel)
    return _lin(sd, f"{p}.attn.proj", out.reshape(b, t, h, w, c))


def _swiglu(sd, p, x):
    return F.linear(
        F.silu(F.linear(x, sd[f"{p}.mlp.w_gate.weight"])) * F.linear(x, sd[f"{p}.mlp.w_up.weight"]),
        sd[f"{p}.mlp.w_down.weight"],
    )


def _upsample(sd, i, x, stride, drop):
    b, t, h, w, _ = x.shape
    y = _lin(sd, f"upsamples.{i}.proj", x)
    c = y.shape[-1] // (stride[0] * stride[1] * stride[2])
    y = (
        y.view(b, t, h, w, c, *stride)
        .permute(0, 1, 5, 2, 6, 3, 7, 4)
        .reshape(b, t * stride[0], h * stride[1], w * stride[2], c)
    )
    return y[:, 1:] if stride[0] == 2 and drop else y


def _resize(x, dim, size, symmetric):
    n = x.shape[dim]
    if n == size:
        return x
    if n > size:
        start = (n - size) // 2 if symmetric else 0
        return x.narrow(dim, start, size)
    need = size - n
    before = need // 2 if symmetric else 0
    parts = (
        [x.narrow(dim, 0, 1).expand(*[before if i == dim else s for i, s in enumerate(x.shape)])]
        if before
        else []
    )
    last = x.narrow(dim, n - 1, 1)
    return torch.cat(
        [*parts, x, last.expand(*[need - before if i == dim else s for i, s in enumerate(x.shape)])], dim
    )


def _diff_step(sd, embedder, context, x_t, t):
    x = _lin(
        sd, "conv_in_x_t", patchify(x_t, patch_size_hw=CFG.patch_size, patch_size_t=1).permute(0, 2, 3, 4, 1)
    )
    t_emb = embedder(t, hidden_dtype=torch.float32)
    mod = _lin(sd, "shared_adaln.proj", F.silu(t_emb)).chunk(7, dim=-1)
    for i in range(CFG.stage_depths[-1]):
        p = f"diff_blocks.{i}"
        rows = [
            mod[j][:, None, None, None, :] + sd[f"{p}.scale_shift_table"][j].view(1, 1, 1, 1, -1)
            for j in range(7)
        ]
        x = x + _lin(sd, f"{p}.context_proj", context)
        x = x + _attention(
            sd, p, _rms(x, sd[f"{p}.norm1.weight"]) * (1 + rows[0]) + rows[1], CFG.stage5_kernel
        )
        x = x + _swiglu(sd, p, _rms(x, sd[f"{p}.norm2.weight"]) * (1 + rows[3]) + rows[4])
    x = _lin(sd, "conv_out", _rms(x, sd["norm_out.weight"])).permute(0, 4, 1, 2, 3)
    return unpatchify(x, patch_size_hw=CFG.patch_size, patch_size_t=1)


def _reference_decode(sd, latent, noise):
    """DiffusionVideoDecoder.forward (one full tile): floor pad, ghost pad, stages 1-4, crop, Euler, crops."""
    embedder = PixArtAlphaCombinedTimestepSizeEmbeddings(embedding_dim=CFG.t_emb_dim, size_emb_dim=0)
    embedder.load_state_dict(
        {k.removeprefix("t_embedder."): v for k, v in sd.items() if k.startswith("t_embedder.")}
    )
    _, _, f, h, w = latent.shape
    mt, mh, mw = min_latent_shape(CFG.stage_kernels, CFG.strides, CFG.stage5_kernel)
    x = _resize(_resize(_resize(latent, 2, max(f, mt), False), 3, max(h, mh), True), 4, max(w, mw), True)
    wf, wh, ww = x.shape[2:]
    ghost = (CFG.stage_kernels[0][0] // 2) * 2
    x = _resize(x, 2, wf + ghost, False)
    x = x * sd["per_channel_statistics.std"].view(1, -1, 1, 1, 1) + sd["per_channel_statistics.mean"].view(
        1, -1, 1, 1, 1
    )
    x = _lin(sd, "conv_in", x.permute(0, 2, 3, 4, 1))
    for s in range(4):
        for b in range(CFG.stage_depths[s]):
            p = f"det_stages.{s}.{b}"
            x = x + _attention(sd, p, _rms(x, sd[f"{p}.norm1.weight"]), CFG.stage_kernels[s])
            x = x + _swiglu(sd, p, _rms(x, sd[f"{p}.norm2.weight"]))
        x = _upsample(sd, s, x, CFG.strides[s], True)
    content_t = max(x.shape[1] - ghost * 8, 1)
    context = _resize(x, 1, min(x.shape[1], max(content_t, CFG.stage5_kernel[0])), False)
    frames = 1 + (wf - 1) * 8
    x_t = _resize(noise, 2, max(frames, CFG.stage5_kernel[0]), False)
    steps = torch.linspace(1.0, 1.0 / CFG.num_steps, CFG.num_steps)
    for i in range(CFG.num_steps):
        t_now = steps[i : i + 1]
        t_next = steps[i + 1 : i + 2] if i + 1 < CFG.num_steps else torch.zeros(1)
        x_t = x_t - (t_now - t_next).view(-1, 1, 1, 1, 1) * _diff_step(sd, embedder, context, x_t, t_now)
    x_t = _resize(x_t, 2, frames, False)
    hb, wb = (wh - h) // 2, (ww - w) // 2
    return x_t[:, :, : 1 + (f - 1) * 8, hb * 32 : (hb + h) * 32, wb * 32 : (wb + w) * 32]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("shape", [(1, 128, 2, 1, 3), (1, 128, 4, 3, 4)])
def test_decode_matches_upstream(shape):
    """A latent under the size floor (edge pads, crops) and one above it; both in float32."""
    model, pack = _seeded_model()
    rng = np.random.default_rng(11)
    latent = rng.standard_normal(shape).astype(np.float32)
    noise = rng.standard_normal(model.noise_shape(shape)).astype(np.float32)
    ours = np.array(model(mx.array(latent), mx.array(noise)))
    with torch.no_grad():
        ref = _reference_decode(
            _upstream_names(pack), torch.from_numpy(latent), torch.from_numpy(noise)
        ).numpy()
    assert ours.shape == ref.shape == (1, 3, 1 + (shape[2] - 1) * 8, shape[3] * 32, shape[4] * 32)
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    assert rel <= 1e-4, rel


def test_pack_keys_load_strictly():
    """Every key of the pack layout is a model parameter and back (fused qkv, mlp.0/2, mean/std)."""
    model, pack = _seeded_model()
    assert set(pack) == {k for k, _ in tree_flatten(model.parameters())}
    assert "diff_blocks.1.attn.qkv.weight" in pack and "t_embedder.mlp.2.bias" in pack


def test_upstream_names_gates_and_baggage_load_as_the_pack_layout():
    """A checkpoint in upstream's names with static gates and `type_emb` reads into the pack layout, the
    gates folded into their Linear rows as upstream's loader does (W <- g * W, b <- g * b)."""
    _, pack = _seeded_model()
    upstream = {k: mx.array(v.numpy()) for k, v in _upstream_names(pack).items()}
    gate = np.linspace(0.5, 1.5, CFG.stage_channels[-1]).astype(np.float32)
    upstream |= {
        "diff_blocks.0.gate_msa": mx.array(gate),
        "type_emb": mx.zeros((128,)),
        "coarse_head.weight": mx.zeros((2,)),
    }
    loaded = {k: np.array(v) for k, v in DiffusionVideoDecoder.pack_to_model(upstream).items()}
    assert set(loaded) == set(pack)
    np.testing.assert_allclose(
        loaded["diff_blocks.0.attn.proj.weight"],
        gate[:, None] * pack["diff_blocks.0.attn.proj.weight"],
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        loaded["diff_blocks.0.attn.proj.bias"], gate * pack["diff_blocks.0.attn.proj.bias"], rtol=1e-6
    )
    for key in ("det_stages.2.0.attn.qkv.weight", "t_embedder.mlp.0.bias", "per_channel_statistics.std"):
        np.testing.assert_array_equal(loaded[key], pack[key])


def test_attention_in_row_chunks_equals_whole_frames(monkeypatch):
    """The gather budget (rows of a frame at a time at full size) changes the working set, not the values."""
    from ltx_engine.models import na_blocks

    q, k, v = (mx.random.normal((1, 5, 9, 11, 2, 16), key=mx.random.key(i)) for i in range(3))
    whole = np.array(na_blocks.na3d(q, k, v, (3, 5, 3)))
    monkeypatch.setattr(na_blocks, "GATHER_BUDGET", 1)
    np.testing.assert_array_equal(np.array(na_blocks.na3d(q, k, v, (3, 5, 3))), whole)
    ref = _na(*(torch.from_numpy(np.array(x)) for x in (q, k, v)), (3, 5, 3)).numpy()
    assert np.abs(whole - ref).max() <= 1e-5 * np.abs(ref).max()
