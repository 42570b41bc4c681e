"""The keyframe-aware diffusion decode (LTX-2.5 `vae_decoder_av` with DFR's keyframe planes), in MLX.

ltx-core 1.0.0 has none; this follows the MLX port's dual-stream path (dgrauet/ltx-2-mlx
`model/video_vae/diffusion_decoder/{keyframes,neighborhood_attention,blocks,chunked,decoder}.py`, the
port's reading of upstream's `keyframes.py` / `joint_eager.joint_na3d`): beside the video volume the
decoder carries a stack of keyframe planes (one latent frame each, plus `type_emb`) through the same
weights, every stage; the planes' T axis holds their times in that stage's units, t_s(f) =
(f + (r - 1) / 2) / r (frame 0 at 0; r the remaining time stride, 8 8 4 2 1), minus the decode's own
start t_s(start), and RoPE rotates them by those times. The streams meet only in the attention
softmax: a video query sees its NATTEN window plus the same spatial window on the 2 planes nearest its
frame (|dt|, then index); a plane query sees its own plane's spatial window plus that window on the 2
video frames nearest its time (|dt|, then frame). Planes upsample spatially only (each a one-frame
clip); stage 5 denoises pixel noise for the planes too (drawn from the second half of the split key)
and discards their prediction. The port runs stage 5 once (t = 1); with more steps the planes take the
same Euler step as the video (not read anywhere: the farm's rule).
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ltx_engine.models import na_blocks
from ltx_engine.models.diffusion_decoder import SPACE_SCALE, TIME_SCALE, DiffusionVideoDecoder, _resize
from ltx_engine.models.vae_blocks import patchify, unpatchify
from ltx_engine.rules.diffusion_tiling import context_keep

SLOTS = 2  # planes a video query sees, frames a plane query sees (the port's KEYFRAME_CONTEXT_SLOTS)


def stage_times(frames: Sequence[int], stride: int, start: int = 0) -> mx.array:
    """Plane times at a stage of remaining time stride `stride`, relative to a decode starting at `start`."""

    def t_s(f: np.ndarray) -> np.ndarray:
        t = (f + np.float32((stride - 1) / 2)) / np.float32(stride)
        return np.where(f == 0, np.float32(0), t).astype(np.float32)

    origin = t_s(np.asarray([start], np.float32))[0]
    return mx.array((t_s(np.asarray(frames, np.float32)) - origin).astype(np.float32))


def remaining_strides(model: DiffusionVideoDecoder) -> list[int]:
    """The time stride still ahead at each stage's input, then 1 for stage 5 (production 8, 8, 4, 2, 1)."""
    steps = [s[0] for s in model.cfg.strides]
    return [int(np.prod(steps[i:])) for i in range(len(steps))] + [1]


def nearest(query: np.ndarray, candidates: np.ndarray, n: int = SLOTS) -> np.ndarray:
    """(Q, min(n, C)) candidate indices ranked by |dt|, ties to the lower index."""
    d = np.abs(query.astype(np.float32)[:, None] - candidates.astype(np.float32)[None, :])
    return np.argsort(d, axis=1, kind="stable")[:, : min(n, candidates.shape[0])]


def _attend(q: mx.array, keys: mx.array, vals: mx.array, idx: mx.array) -> mx.array:
    """q (B, H, W, NH, D) against keys[:, idx] for idx (H, W, K) into flat keys (B, N, NH, D)."""
    b, h, w, nh, d = q.shape
    rows = max(1, na_blocks.GATHER_BUDGET // max(1, b * w * idx.shape[-1] * nh * d))
    parts = []
    for h0 in range(0, h, rows):
        kg, vg = keys[:, idx[h0 : h0 + rows]], vals[:, idx[h0 : h0 + rows]]  # (B, rows, W, K, NH, D)
        weights = mx.softmax(mx.sum(q[:, h0 : h0 + rows, :, None] * kg, axis=-1), axis=3, precise=True)
        parts.append(mx.sum(weights[..., None] * vg, axis=3))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)


def joint_na3d(
    q, k, v, kq, kk, kv, times: mx.array, kernel: tuple[int, int, int]
) -> tuple[mx.array, mx.array]:
    """Joint video / plane neighbourhood attention (video (B, T, H, W, NH, D), planes (B, P, H, W, NH, D))."""
    b, t, h, w, nh, d = q.shape
    p = kq.shape[1]
    keys = mx.concatenate([k.reshape(b, t * h * w, nh, d), kk.reshape(b, p * h * w, nh, d)], axis=1)
    vals = mx.concatenate([v.reshape(b, t * h * w, nh, d), kv.reshape(b, p * h * w, nh, d)], axis=1)
    plane = na_blocks._plane_index(h, w, kernel[1], kernel[2])  # (H, W, kh*kw)
    starts, kt = na_blocks.window_starts(t, kernel[0])
    ptimes = np.array(times, dtype=np.float32)
    to_planes, to_frames = nearest(np.arange(t), ptimes), nearest(ptimes, np.arange(t))

    def rows(offsets: np.ndarray) -> mx.array:
        return (
            mx.array((offsets * h * w).astype(np.int32))[None, None, :, None] + plane[:, :, None, :]
        ).reshape(h, w, -1)

    video = [
        _attend(q[:, i], keys, vals, rows(np.concatenate([starts[i] + np.arange(kt), t + to_planes[i]])))
        for i in range(t)
    ]
    planes = [_attend(kq[:, j], keys, vals, rows(np.concatenate([[t + j], to_frames[j]]))) for j in range(p)]
    return mx.stack(video, axis=1), mx.stack(planes, axis=1)


def _qkv(attn: na_blocks.NeighbourhoodAttention3D, x: mx.array, t_pos: mx.array | None = None) -> tuple:
    b, t, h, w, _ = x.shape
    q, k, v = (y.reshape(b, t, h, w, attn.heads, attn.head_dim) for y in mx.split(attn.qkv(x), 3, axis=-1))
    q = na_blocks.apply_rope(attn.q_norm(q) * (attn.head_dim**-0.5), attn.split, t_pos)
    return q, na_blocks.apply_rope(attn.k_norm(k), attn.split, t_pos), v


def joint_attention(attn, x: mx.array, kx: mx.array, times: mx.array) -> tuple[mx.array, mx.array]:
    """The block's attention on both streams (shared qkv / norms / proj); planes rotated by their times."""
    q, k, v = _qkv(attn, x)
    kq, kk, kv = _qkv(attn, kx, times)
    o, ko = joint_na3d(q, k, v, kq, kk, kv, times, attn.kernel)
    return attn.proj(o.reshape(x.shape)), attn.proj(ko.reshape(kx.shape))


def na_block(
    block: na_blocks.NABlock, x: mx.array, kx: mx.array, times: mx.array
) -> tuple[mx.array, mx.array]:
    o, ko = joint_attention(block.attn, block.norm1(x), block.norm1(kx), times)
    x, kx = x + o, kx + ko
    return x + block.mlp(block.norm2(x)), kx + block.mlp(block.norm2(kx))


def diffusion_block(block, x, context, kx, kcontext, modulation, times) -> tuple[mx.array, mx.array]:
    """A stage-5 block on both streams: each its own context, one AdaLN modulation, joint attention."""
    mod = modulation + block.scale_shift_table[None]
    row = [mod[:, i][:, None, None, None, :] for i in range(na_blocks.ADALN_CHUNKS)]

    def msa(y: mx.array) -> mx.array:
        return block.norm1(y) * (1.0 + row[na_blocks.SCALE_MSA]) + row[na_blocks.SHIFT_MSA]

    def mlp(y: mx.array) -> mx.array:
        return y + block.mlp(block.norm2(y) * (1.0 + row[na_blocks.SCALE_MLP]) + row[na_blocks.SHIFT_MLP])

    x, kx = x + block.context_proj(context), kx + block.context_proj(kcontext)
    o, ko = joint_attention(block.attn, msa(x), msa(kx), times)
    return mlp(x + o), mlp(kx + ko)


def upsample_planes(up: na_blocks.PixelShuffleUpsample, kx: mx.array) -> mx.array:
    """Planes (B, P, H, W, C) through a stage's upsample as one-frame clips: only H and W grow."""
    b, p, h, w, c = kx.shape
    y = up(kx.reshape(b * p, 1, h, w, c), drop_leading_frame=True)
    return y[:, 0].reshape(b, p, *y.shape[2:])


def context(model: DiffusionVideoDecoder, latent: mx.array, planes: mx.array, frames, start: int) -> tuple:
    """Stages 1-4 on the (min-padded) latent and its planes -> (video context, plane context)."""
    cfg, stats = model.cfg, model.per_channel_statistics
    x = _resize(latent, 2, latent.shape[2] + cfg.ghost_latents, symmetric=False)
    x = model.conv_in(stats.un_normalize(x.transpose(0, 2, 3, 4, 1)))
    kx = model.conv_in(stats.un_normalize(planes.transpose(0, 2, 3, 4, 1)) + model.type_emb)
    strides = remaining_strides(model)
    for i, stage in enumerate(model.det_stages):
        times = stage_times(frames, strides[i], start)
        for block in stage:
            x, kx = na_block(block, x, kx, times)
        x, kx = model.upsamples[i](x, drop_leading_frame=True), upsample_planes(model.upsamples[i], kx)
    keep = context_keep(x.shape[1], cfg.ghost_latents, TIME_SCALE, cfg.stage5_kernel[0])
    return _resize(x, 1, keep, symmetric=False), kx


def velocity(
    model: DiffusionVideoDecoder, ctx: tuple, x_t: mx.array, kx_t: mx.array, t: mx.array, times
) -> tuple:
    """One stage-5 evaluation of both streams: pixels (B, 3, F, H, W) and planes (B, 3, P, H, W)."""
    cfg = model.cfg

    def embed(y: mx.array) -> mx.array:
        return model.conv_in_x_t(patchify(y.transpose(0, 2, 3, 4, 1), cfg.patch_size))

    def out(y: mx.array) -> mx.array:
        return unpatchify(model.conv_out(model.norm_out(y)), cfg.patch_size).transpose(0, 4, 1, 2, 3)

    modulation = model.shared_adaln.proj(nn.silu(model.t_embedder(cfg.timestep_scale_multiplier * t)))
    modulation = modulation.reshape(t.shape[0], 7, -1)
    x, kx = embed(x_t), embed(kx_t)
    for block in model.diff_blocks:
        x, kx = diffusion_block(block, x, ctx[0], kx, ctx[1], modulation, times)
    return out(x), out(kx)


def denoise(model: DiffusionVideoDecoder, ctx: tuple, noise: mx.array, knoise: mx.array, times) -> mx.array:
    """The decoder's Euler loop on both streams; the video's result (the planes' is discarded)."""
    ts = model.timesteps()
    x, kx = noise.astype(mx.float32), knoise.astype(mx.float32)
    for i, t_now in enumerate(ts):
        t_next = ts[i + 1] if i + 1 < len(ts) else 0.0
        pred, kpred = velocity(model, ctx, x, kx, mx.full((x.shape[0],), t_now, dtype=mx.float32), times)
        if model.cfg.model_output_type == "x0":
            if i + 1 == len(ts):
                return pred
            pred, kpred = (x - pred) / t_now, (kx - kpred) / t_now
        x, kx = x - (t_now - t_next) * pred, kx - (t_now - t_next) * kpred
    return x


def plane_noise_shape(model: DiffusionVideoDecoder, latent_shape: tuple, planes: int) -> tuple[int, ...]:
    """The planes' stage-5 noise: one pixel frame per plane at the padded latent's pixel size."""
    _, h, w = model.work_latent(latent_shape)
    return (latent_shape[0], model.cfg.out_channels, planes, h * SPACE_SCALE, w * SPACE_SCALE)


def decode(
    model, latent: mx.array, planes: mx.array, frames: Sequence[int], start: int, noise, knoise
) -> mx.array:
    """Decode a latent (or a tile starting at global pixel frame `start`) with keyframe planes
    (B, C, P, h, w) at global pixel `frames`; pixels of the latent's own extent."""
    _, _, f, h, w = latent.shape
    wf, wh, ww = model.work_latent(latent.shape)
    x = _resize(
        _resize(_resize(latent, 2, wf, symmetric=False), 3, wh, symmetric=True), 4, ww, symmetric=True
    )
    kp = _resize(_resize(planes.astype(latent.dtype), 3, wh, symmetric=True), 4, ww, symmetric=True)
    ctx = context(model, x, kp, frames, start)
    pixel_frames = 1 + (wf - 1) * TIME_SCALE
    x_t = _resize(noise, 2, max(pixel_frames, model.cfg.stage5_kernel[0]), symmetric=False)
    times = stage_times(frames, 1, start)
    pixels = denoise(model, ctx, x_t, knoise, times)[:, :, :pixel_frames]
    return model._crop(pixels, (f, h, w), (wh, ww))


def decode_seeded_keyframes(
    model, latent: mx.array, planes: mx.array, frames, start: int, seed: int
) -> mx.array:
    """As `decode_seeded`, with keyframes: the video noise from key(seed) as there, the planes' from the
    second half of its split (the port's `_keyframe_noise_key`)."""
    key = mx.random.key(int(seed))
    noise = mx.random.normal(model.noise_shape(latent.shape), key=key)
    knoise = mx.random.normal(
        plane_noise_shape(model, latent.shape, planes.shape[2]), key=mx.random.split(key)[1]
    )
    return decode(model, latent, planes, frames, start, noise, knoise)
