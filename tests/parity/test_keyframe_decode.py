"""The keyframe-aware diffusion decode against the reference's formulas, float32.

ltx-core 1.0.0 has no diffusion decoder, and upstream's keyframe path (after 1.2.0: `keyframes.py`,
`joint_eager.joint_na3d`, `_decode_one_tile_with_keyframes`) was not readable here; the formulas below
are the MLX port's dual-stream path (dgrauet/ltx-2-mlx `diffusion_decoder/keyframes.py`
`keyframe_stage_times` / `video_keyframe_slots` / `keyframe_video_slots`, `neighborhood_attention.py`
`joint_na3d_reference`, `blocks.py` / `chunked.py` `forward_with_keyframes`, `decoder.py`
`keyframe_stream_from_latents`), written out in torch on top of the plain decoder's reference
(`test_diffusion_decoder`): planes = un-normalised latent + `type_emb` through the shared weights,
times t_s(f) = (f + (r-1)/2) / r (0 at frame 0) minus t_s(start), RoPE at those times, the joint
softmax (video: window + its 2 nearest planes' spatial window; plane: its window + its 2 nearest
frames'), spatial-only plane upsamples, plane noise denoised alongside and discarded. The attention is
a masked SDPA per query frame / plane, not our gather, and the slot ranking is Python's sort.
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

from ltx_engine.models import keyframe_decode  # noqa: E402
from ltx_engine.rules.diffusion_tiling import min_latent_shape  # noqa: E402
from tests.parity.test_diffusion_decoder import (  # noqa: E402
    CFG,
    _bounds,
    _lin,
    _resize,
    _rms,
    _seeded_model,
    _swiglu,
    _upsample,
    _upstream_names,
)

SPLIT = (4, 6, 6)  # rope_math.default_rope_dim_split(16)


def _t_s(frame: int, stride: int) -> float:
    return 0.0 if frame == 0 else float(np.float32((frame + (stride - 1) / 2) / stride))


def _times(frames, stride, start):
    return torch.tensor([_t_s(f, stride) - _t_s(start, stride) for f in frames], dtype=torch.float32)


def _rope(x, t_pos):
    parts, start = [], 0
    for axis, d in zip((1, 2, 3), SPLIT, strict=True):
        xc = x[..., start : start + d]
        inv = (1.0 / torch.pow(torch.tensor(10000.0, dtype=torch.float64), torch.arange(0, d, 2) / d)).float()
        pos = t_pos if axis == 1 else torch.arange(x.shape[axis], dtype=torch.float32)
        shape = [1, 1, 1, 1, 1, d // 2]
        shape[axis] = pos.shape[0]
        ang = (pos[:, None] * inv[None, :]).reshape(shape)
        xe, xo = xc[..., 0::2], xc[..., 1::2]
        rot = torch.stack([xe * ang.cos() - xo * ang.sin(), xe * ang.sin() + xo * ang.cos()], -1)
        parts.append(rot.reshape(xc.shape))
        start += d
    return torch.cat(parts, -1)


def _joint_na(q, k, v, kq, kk, kv, times, kernel):
    """Per query frame (and per plane) a masked SDPA over its keys: the window frames + 2 slot planes
    (video), its plane + 2 nearest frames (plane), each key frame masked to the query's spatial window."""
    b, t, h, w, nh, d = q.shape
    p = kq.shape[1]
    (st, kt), (sh, kh), (sw, kw) = _bounds(t, kernel[0]), _bounds(h, kernel[1]), _bounds(w, kernel[2])
    hv = torch.tensor([[sh[i] <= j < sh[i] + kh for j in range(h)] for i in range(h)])
    wv = torch.tensor([[sw[i] <= j < sw[i] + kw for j in range(w)] for i in range(w)])
    spatial = (hv[:, None, :, None] & wv[None, :, None, :]).reshape(h * w, h * w)
    tl = times.tolist()

    def sdpa(query, frames_k, frames_v):
        n = len(frames_k)
        mask = torch.zeros(h * w, n * h * w).masked_fill(
            ~spatial.repeat(1, n), torch.finfo(torch.float32).min
        )
        ks = torch.cat([f.reshape(b, h * w, nh, d) for f in frames_k], 1).transpose(1, 2)
        vs = torch.cat([f.reshape(b, h * w, nh, d) for f in frames_v], 1).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            query.reshape(b, h * w, nh, d).transpose(1, 2), ks, vs, attn_mask=mask, scale=1.0
        )
        return o.transpose(1, 2).reshape(b, h, w, nh, d)

    out, kout = torch.empty_like(q), torch.empty_like(kq)
    for ti in range(t):
        slots = sorted(range(p), key=lambda j: (abs(tl[j] - ti), j))[:2]
        fr = list(range(st[ti], st[ti] + kt))
        out[:, ti] = sdpa(
            q[:, ti],
            [k[:, f] for f in fr] + [kk[:, j] for j in slots],
            [v[:, f] for f in fr] + [kv[:, j] for j in slots],
        )
    for pj in range(p):
        near = sorted(range(t), key=lambda f: (abs(f - tl[pj]), f))[:2]
        kout[:, pj] = sdpa(
            kq[:, pj], [kk[:, pj]] + [k[:, f] for f in near], [kv[:, pj]] + [v[:, f] for f in near]
        )
    return out, kout


def _attention(sd, pre, x, kx, times, kernel):
    def qkv(y, t_pos):
        b, t, h, w, c = y.shape
        q, k, v = (_lin(sd, f"{pre}.attn.qkv.to_{n}", y).view(b, t, h, w, c // 16, 16) for n in "qkv")
        q = _rope(_rms(q, sd[f"{pre}.attn.q_norm.weight"]) * 16**-0.5, t_pos)
        return q, _rope(_rms(k, sd[f"{pre}.attn.k_norm.weight"]), t_pos), v

    q, k, v = qkv(x, torch.arange(x.shape[1], dtype=torch.float32))
    kq, kk, kv = qkv(kx, times)
    o, ko = _joint_na(q, k, v, kq, kk, kv, times, kernel)
    return _lin(sd, f"{pre}.attn.proj", o.reshape(x.shape)), _lin(
        sd, f"{pre}.attn.proj", ko.reshape(kx.shape)
    )


def _diff_step(sd, embedder, ctx, kctx, x_t, kx_t, t, times):
    def embed(y):
        return _lin(
            sd,
            "conv_in_x_t",
            patchify(y, patch_size_hw=CFG.patch_size, patch_size_t=1).permute(0, 2, 3, 4, 1),
        )

    def out(y):
        y = _lin(sd, "conv_out", _rms(y, sd["norm_out.weight"])).permute(0, 4, 1, 2, 3)
        return unpatchify(y, patch_size_hw=CFG.patch_size, patch_size_t=1)

    x, kx = embed(x_t), embed(kx_t)
    mod = _lin(sd, "shared_adaln.proj", F.silu(embedder(t, hidden_dtype=torch.float32))).chunk(7, dim=-1)
    for i in range(CFG.stage_depths[-1]):
        p = f"diff_blocks.{i}"
        r = [
            mod[j][:, None, None, None, :] + sd[f"{p}.scale_shift_table"][j].view(1, 1, 1, 1, -1)
            for j in range(7)
        ]
        x, kx = x + _lin(sd, f"{p}.context_proj", ctx), kx + _lin(sd, f"{p}.context_proj", kctx)
        o, ko = _attention(
            sd,
            p,
            *(_rms(y, sd[f"{p}.norm1.weight"]) * (1 + r[0]) + r[1] for y in (x, kx)),
            times,
            CFG.stage5_kernel,
        )
        x, kx = x + o, kx + ko
        x, kx = (y + _swiglu(sd, p, _rms(y, sd[f"{p}.norm2.weight"]) * (1 + r[3]) + r[4]) for y in (x, kx))
    return out(x), out(kx)


def _reference_decode(sd, latent, planes, frames, start, noise, knoise):
    embedder = PixArtAlphaCombinedTimestepSizeEmbeddings(embedding_dim=CFG.t_emb_dim, size_emb_dim=0)
    embedder.load_state_dict(
        {k.removeprefix("t_embedder."): v for k, v in sd.items() if k.startswith("t_embedder.")}
    )
    _, _, f, h, w = latent.shape
    mt, mh, mw = min_latent_shape(CFG.stage_kernels, CFG.strides, CFG.stage5_kernel)
    x = _resize(_resize(_resize(latent, 2, max(f, mt), False), 3, max(h, mh), True), 4, max(w, mw), True)
    kx = _resize(_resize(planes, 3, max(h, mh), True), 4, max(w, mw), True)
    wf, wh, ww = x.shape[2:]
    ghost = (CFG.stage_kernels[0][0] // 2) * 2
    std, mean = (sd[f"per_channel_statistics.{n}"].view(1, -1, 1, 1, 1) for n in ("std", "mean"))
    x = _lin(sd, "conv_in", (_resize(x, 2, wf + ghost, False) * std + mean).permute(0, 2, 3, 4, 1))
    kx = _lin(sd, "conv_in", (kx * std + mean).permute(0, 2, 3, 4, 1) + sd["type_emb"])
    for s, r in enumerate((8, 8, 4, 2)):
        times = _times(frames, r, start)
        for b in range(CFG.stage_depths[s]):
            p = f"det_stages.{s}.{b}"
            o, ko = _attention(
                sd,
                p,
                _rms(x, sd[f"{p}.norm1.weight"]),
                _rms(kx, sd[f"{p}.norm1.weight"]),
                times,
                CFG.stage_kernels[s],
            )
            x, kx = x + o, kx + ko
            x, kx = (y + _swiglu(sd, p, _rms(y, sd[f"{p}.norm2.weight"])) for y in (x, kx))
        x = _upsample(sd, s, x, CFG.strides[s], True)
        bp = kx.shape[:2]
        kx = _upsample(sd, s, kx.reshape(bp[0] * bp[1], 1, *kx.shape[2:]), CFG.strides[s], True)
        kx = kx[:, 0].reshape(*bp, *kx.shape[2:])
    content_t = max(x.shape[1] - ghost * 8, 1)
    ctx = _resize(x, 1, min(x.shape[1], max(content_t, CFG.stage5_kernel[0])), False)
    n_px = 1 + (wf - 1) * 8
    x_t, kx_t = _resize(noise, 2, max(n_px, CFG.stage5_kernel[0]), False), knoise
    steps = torch.linspace(1.0, 1.0 / CFG.num_steps, CFG.num_steps)
    times = _times(frames, 1, start)
    for i in range(CFG.num_steps):
        t_now = steps[i : i + 1]
        dt = t_now - (steps[i + 1 : i + 2] if i + 1 < CFG.num_steps else torch.zeros(1))
        pred, kpred = _diff_step(sd, embedder, ctx, kx, x_t, kx_t, t_now, times)
        x_t, kx_t = x_t - dt.view(-1, 1, 1, 1, 1) * pred, kx_t - dt.view(-1, 1, 1, 1, 1) * kpred
    hb, wb = (wh - h) // 2, (ww - w) // 2
    return x_t[:, :, : 1 + (f - 1) * 8, hb * 32 : (hb + h) * 32, wb * 32 : (wb + w) * 32]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("shape", "frames", "start"),
    [((1, 128, 2, 1, 2), (0, 8), 0), ((1, 128, 3, 2, 3), (4, 16, 40), 8)],
)
def test_keyframe_decode_matches_reference(shape, frames, start):
    """A whole clip with planes at its ends, and a tile starting at frame 8 with a plane before it,
    one inside and one after (times relative to the tile; 3 planes, each query sees 2)."""
    model, pack = _seeded_model()
    rng = np.random.default_rng(5)
    latent = rng.standard_normal(shape).astype(np.float32)
    planes = rng.standard_normal((1, 128, len(frames), *shape[3:])).astype(np.float32)
    noise = rng.standard_normal(model.noise_shape(shape)).astype(np.float32)
    knoise = rng.standard_normal(keyframe_decode.plane_noise_shape(model, shape, len(frames))).astype(
        np.float32
    )
    ours = keyframe_decode.decode(
        model, *(mx.array(a) for a in (latent, planes)), frames, start, mx.array(noise), mx.array(knoise)
    )
    with torch.no_grad():
        ref = _reference_decode(
            _upstream_names(pack),
            *(torch.from_numpy(a) for a in (latent, planes)),
            frames,
            start,
            torch.from_numpy(noise),
            torch.from_numpy(knoise),
        ).numpy()
    ours = np.array(ours)
    assert ours.shape == ref.shape == (1, 3, 1 + (shape[2] - 1) * 8, shape[3] * 32, shape[4] * 32)
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    assert rel <= 1e-4, rel
    plain = np.array(model(mx.array(latent), mx.array(noise)))
    assert np.abs(plain - ours).max() > 1e-3 * np.abs(ref).max()  # the planes change the decode


def test_stage_times_follow_the_chunk_centre_rule():
    """t_s(f) = (f + (r-1)/2) / r, frame 0 at 0, minus the decode start's: the port's worked values."""
    np.testing.assert_allclose(np.array(keyframe_decode.stage_times([0, 8, 24], 8)), [0.0, 1.4375, 3.4375])
    np.testing.assert_allclose(np.array(keyframe_decode.stage_times([16, 24], 2, 8)), [4.0, 8.0])
    model, _ = _seeded_model()
    assert keyframe_decode.remaining_strides(model) == [8, 8, 4, 2, 1]
