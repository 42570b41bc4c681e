"""LTX-2.5's diffusion video decoder (`vae_decoder_av.safetensors`, `--video-decoder diffusion`), in MLX.

ltx-core 1.0.0 has none; this follows upstream's `DiffusionVideoDecoder` (ltx-core after 1.2.0,
`model/video_vae/diffusion_video_decoder.py`): stages 1-4 are neighbourhood-attention stages that
upsample the latent (x1/x2/x2/x2 in time, x2 each in space) into a context volume, then stage 5's
diffusion blocks denoise patchified pixel noise guided by that context, with Euler steps on
`linspace(1, 1/n, n)` (n = 2 by default: one evaluation per step, v-prediction). One call decodes
one whole clip or one latent tile of it (the farm blends tiles, `ltx_engine.rules.diffusion_tiling`).

Pack keys (`vae_decoder_av.` stripped) are the MLX packs': fused `attn.qkv`, `t_embedder.mlp.{0,2}`,
`per_channel_statistics.{mean,std}`; the architecture is in the file's `config` metadata (`vae.decoder`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

from ltx_engine.models.na_blocks import DiffusionNABlock, NABlock, PixelShuffleUpsample, TimestepEmbedder
from ltx_engine.models.vae_blocks import PerChannelStatistics, patchify, unpatchify
from ltx_engine.rules.diffusion_tiling import context_keep, min_latent_shape, symmetric_pad

Kernel = tuple[int, int, int]
TIME_SCALE, SPACE_SCALE = 8, 32  # latent -> pixel (the conv VAE's)
_UNUSED = ("coarse_",)  # carried by checkpoints, read by neither upstream nor the port
_GATES = {"gate_msa": "attn.proj", "gate_mlp": "mlp.w_down", "gate_ctx": "context_proj"}
_RENAMES = {
    "t_embedder.timestep_embedder.linear_1.weight": "t_embedder.mlp.0.weight",
    "t_embedder.timestep_embedder.linear_1.bias": "t_embedder.mlp.0.bias",
    "t_embedder.timestep_embedder.linear_2.weight": "t_embedder.mlp.2.weight",
    "t_embedder.timestep_embedder.linear_2.bias": "t_embedder.mlp.2.bias",
    "per_channel_statistics.mean-of-means": "per_channel_statistics.mean",
    "per_channel_statistics.std-of-means": "per_channel_statistics.std",
}


@dataclass(frozen=True)
class DiffusionDecoderConfig:
    """Upstream's constructor arguments (production defaults; a pack's config overrides them)."""

    in_channels: int = 128
    out_channels: int = 3
    patch_size: int = 4
    head_dim: int = 64
    stage_channels: tuple[int, ...] = (1024, 512, 256, 256, 128)
    stage_depths: tuple[int, ...] = (4, 6, 4, 2, 8)
    stage_kernels: tuple[Kernel, ...] = ((3, 7, 7), (3, 7, 7), (3, 5, 5), (3, 5, 5), (3, 3, 3))
    upsamples: tuple[tuple[Kernel, int], ...] = (
        ((1, 2, 2), 2),
        ((2, 1, 1), 2),
        ((2, 2, 2), 1),
        ((2, 2, 2), 2),
    )
    stage5_kernel: Kernel = (3, 7, 7)
    t_emb_dim: int = 384
    num_steps: int = 2
    timestep_scale_multiplier: float = 1.0
    model_output_type: str = "v"
    strides: tuple[Kernel, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "strides", tuple(tuple(s) for s, _ in self.upsamples))

    @classmethod
    def from_vae(cls, vae: dict) -> DiffusionDecoderConfig:
        """From a `vae` config dict (fields under `decoder`, as upstream's `_build_diffusion_video_decoder`)."""
        d = vae.get("decoder", vae)
        out: dict = {}
        for name in (
            "in_channels",
            "out_channels",
            "patch_size",
            "head_dim",
            "t_emb_dim",
            "timestep_scale_multiplier",
        ):
            if name in d:
                out[name] = d[name]
        if "default_num_inference_steps" in d:
            out["num_steps"] = int(d["default_num_inference_steps"])
        for name in ("stage_channels", "stage_depths"):
            if name in d:
                out[name] = tuple(int(x) for x in d[name])
        if "stage_kernels" in d:
            out["stage_kernels"] = tuple(tuple(int(x) for x in k) for k in d["stage_kernels"])
        if "upsamples" in d:
            out["upsamples"] = tuple((tuple(int(x) for x in s), int(r)) for s, r in d["upsamples"])
        if "stage5_kernel" in d:
            out["stage5_kernel"] = tuple(int(x) for x in d["stage5_kernel"])
        return cls(model_output_type=vae.get("model_output_type", "v"), **out)

    def to_vae(self) -> dict:
        """The `vae` dict a pack file's metadata carries (inverse of `from_vae`)."""
        return {
            "_class_name": "CausalDiffusionVAE",
            "model_output_type": self.model_output_type,
            "decoder": {
                "in_channels": self.in_channels,
                "out_channels": self.out_channels,
                "patch_size": self.patch_size,
                "head_dim": self.head_dim,
                "t_emb_dim": self.t_emb_dim,
                "default_num_inference_steps": self.num_steps,
                "timestep_scale_multiplier": self.timestep_scale_multiplier,
                "stage_channels": list(self.stage_channels),
                "stage_depths": list(self.stage_depths),
                "stage_kernels": [list(k) for k in self.stage_kernels],
                "upsamples": [[list(s), r] for s, r in self.upsamples],
                "stage5_kernel": list(self.stage5_kernel),
            },
        }

    @property
    def ghost_latents(self) -> int:
        """Latent frames replicated at the end through stages 1-4 (NATTEN's last-frame border)."""
        return (self.stage_kernels[0][0] // 2) * 2

    @property
    def min_latent(self) -> tuple[int, int, int]:
        return min_latent_shape(self.stage_kernels, self.strides, self.stage5_kernel)


def tiny_config() -> DiffusionDecoderConfig:
    """The tiny pack's decoder: the real stage ladder (x8 time, x32 space) at widths 128 -> 16, one block
    per stage and two diffusion blocks, 3x3x3 windows."""
    k = (3, 3, 3)
    return DiffusionDecoderConfig(
        head_dim=16,
        stage_channels=(128, 64, 32, 32, 16),
        stage_depths=(1, 1, 1, 1, 2),
        stage_kernels=(k, k, k, k, k),
        stage5_kernel=k,
        t_emb_dim=32,
    )


def _edge_pad(x: mx.array, axis: int, before: int, after: int) -> mx.array:
    """Replicate the first / last slice along `axis` (upstream's `resize_axis` pad)."""
    if not before and not after:
        return x
    n = x.shape[axis]
    parts = []
    if before:
        parts.append(mx.repeat(mx.take(x, mx.array([0]), axis=axis), before, axis=axis))
    parts.append(x)
    if after:
        parts.append(mx.repeat(mx.take(x, mx.array([n - 1]), axis=axis), after, axis=axis))
    return mx.concatenate(parts, axis=axis)


def _resize(x: mx.array, axis: int, size: int, symmetric: bool) -> mx.array:
    """Pad (edge) or crop `axis` to `size`: symmetric splits the difference (leftover at the end),
    else the end only (upstream's `resize_axis` modes `symmetric` / `repeat_last`)."""
    n = x.shape[axis]
    if n == size:
        return x
    if n < size:
        before, after = symmetric_pad(n, size) if symmetric else (0, size - n)
        return _edge_pad(x, axis, before, after)
    start = (n - size) // 2 if symmetric else 0
    return mx.take(x, mx.arange(start, start + size), axis=axis)


class DiffusionVideoDecoder(nn.Module):
    """Latent (B, 128, f, h, w) + noise -> pixels (B, 3, 1 + 8(f-1), 32h, 32w) in about [-1, 1]."""

    def __init__(self, cfg: DiffusionDecoderConfig):
        super().__init__()
        self.cfg = cfg
        ch = cfg.stage_channels
        self.per_channel_statistics = PerChannelStatistics(cfg.in_channels)
        self.type_emb = mx.zeros((cfg.in_channels,))  # added to keyframe planes only (keyframe_decode)
        self.conv_in = nn.Linear(cfg.in_channels, ch[0])
        self.det_stages = [
            [NABlock(ch[i], cfg.stage_kernels[i], cfg.head_dim) for _ in range(cfg.stage_depths[i])]
            for i in range(len(ch) - 1)
        ]
        self.upsamples = [PixelShuffleUpsample(ch[i], s, r) for i, (s, r) in enumerate(cfg.upsamples)]
        self.t_embedder = TimestepEmbedder(cfg.t_emb_dim)
        pixels = cfg.out_channels * cfg.patch_size**2
        self.conv_in_x_t = nn.Linear(pixels, ch[-1])
        self.shared_adaln = nn.Module()
        self.shared_adaln.proj = nn.Linear(cfg.t_emb_dim, 7 * ch[-1])
        self.diff_blocks = [
            DiffusionNABlock(ch[-1], cfg.stage5_kernel, ch[-1], cfg.head_dim)
            for _ in range(cfg.stage_depths[-1])
        ]
        self.norm_out = nn.RMSNorm(ch[-1], eps=1e-6)
        self.conv_out = nn.Linear(ch[-1], pixels)

    @classmethod
    def from_config(cls, cfg: dict) -> DiffusionVideoDecoder:
        return cls(DiffusionDecoderConfig.from_vae(cfg.get("vae", cfg)))

    @staticmethod
    def pack_to_model(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """The pack's keys are the model's (fused qkv, `mlp.0`/`mlp.2`, mean/std); also read: upstream's
        names (split to_q/k/v, `timestep_embedder.linear_*`, `mean-of-means`), static gates folded into
        their Linear as upstream's loader does, and what neither reference uses (`coarse_*`) dropped;
        `type_emb` is the keyframe planes' (the port's `keyframe_stream_from_latents`)."""
        out = {_RENAMES.get(k, k): v for k, v in weights.items() if not k.startswith(_UNUSED)}
        for k in [k for k in out if k.endswith(".qkv.to_q.weight") or k.endswith(".qkv.to_q.bias")]:
            base, leaf = k.rsplit(".to_q.", 1)
            out[f"{base}.{leaf}"] = mx.concatenate([out.pop(f"{base}.to_{n}.{leaf}") for n in "qkv"], axis=0)
        for k in [k for k in out if k.endswith(tuple(_GATES))]:
            gate, block = out.pop(k).astype(mx.float32), k.rsplit(".", 1)[0]
            for leaf in ("weight", "bias"):
                name = f"{block}.{_GATES[k.rsplit('.', 1)[1]]}.{leaf}"
                if name in out:
                    w = out[name]
                    out[name] = ((gate[:, None] if w.ndim == 2 else gate) * w.astype(mx.float32)).astype(
                        w.dtype
                    )
        return out

    def work_latent(self, latent_shape: tuple[int, ...]) -> tuple[int, int, int]:
        """The latent (f, h, w) after the size floor (edge pads) the attention windows need."""
        _, _, f, h, w = latent_shape
        mt, mh, mw = self.cfg.min_latent
        return max(f, mt), max(h, mh), max(w, mw)

    def noise_shape(self, latent_shape: tuple[int, ...]) -> tuple[int, int, int, int, int]:
        """The stage-5 noise a decode of this latent takes: the padded latent's pixels (upstream draws it so)."""
        f, h, w = self.work_latent(latent_shape)
        return (
            latent_shape[0],
            self.cfg.out_channels,
            1 + (f - 1) * TIME_SCALE,
            h * SPACE_SCALE,
            w * SPACE_SCALE,
        )

    def _stage(self, x: mx.array, i: int) -> mx.array:
        for block in self.det_stages[i]:
            x = block(x)
        return self.upsamples[i](x, drop_leading_frame=True)

    def context(self, latent: mx.array) -> mx.array:
        """Stages 1-4 on a (min-padded) latent (B, C, f, h, w) -> stage-5 context (B, T, H, W, C5)."""
        cfg = self.cfg
        x = _resize(latent, 2, latent.shape[2] + cfg.ghost_latents, symmetric=False)
        x = self.per_channel_statistics.un_normalize(x.transpose(0, 2, 3, 4, 1))
        x = self.conv_in(x)
        for i in range(len(self.det_stages)):
            x = self._stage(x, i)
        keep = context_keep(x.shape[1], cfg.ghost_latents, TIME_SCALE, cfg.stage5_kernel[0])
        return _resize(x, 1, keep, symmetric=False)

    def velocity(self, context: mx.array, x_t: mx.array, t: mx.array) -> mx.array:
        """One stage-5 evaluation: pixels x_t (B, 3, F, H, W) at time t (B,) -> prediction (B, 3, F, H, W)."""
        cfg = self.cfg
        x = self.conv_in_x_t(patchify(x_t.transpose(0, 2, 3, 4, 1), cfg.patch_size))
        modulation = self.shared_adaln.proj(nn.silu(self.t_embedder(cfg.timestep_scale_multiplier * t)))
        modulation = modulation.reshape(t.shape[0], 7, -1)
        for block in self.diff_blocks:
            x = block(x, context, modulation)
        out = unpatchify(self.conv_out(self.norm_out(x)), cfg.patch_size)
        return out.transpose(0, 4, 1, 2, 3)

    def timesteps(self) -> list[float]:
        n = self.cfg.num_steps
        return [1.0 - i * (1.0 - 1.0 / n) / (n - 1) for i in range(n)] if n > 1 else [1.0]

    def denoise(self, context: mx.array, noise: mx.array) -> mx.array:
        """Euler steps from t = 1 (v-prediction: x <- x - dt * v; x0: the last prediction is the output)."""
        ts = self.timesteps()
        x = noise.astype(mx.float32)
        batch = x.shape[0]
        for i, t_now in enumerate(ts):
            t_next = ts[i + 1] if i + 1 < len(ts) else 0.0
            pred = self.velocity(context, x, mx.full((batch,), t_now, dtype=mx.float32)).astype(mx.float32)
            if self.cfg.model_output_type == "x0":
                if i + 1 == len(ts):
                    return pred
                pred = (x - pred) / t_now
            x = x - (t_now - t_next) * pred
        return x

    def __call__(self, latent: mx.array, noise: mx.array) -> mx.array:
        """Decode a latent (or a latent tile) with noise of `noise_shape(latent.shape)`; pixels of the
        latent's own extent (B, 3, 1 + 8(f-1), 32h, 32w)."""
        _, _, f, h, w = latent.shape
        wf, wh, ww = self.work_latent(latent.shape)
        x = _resize(
            _resize(_resize(latent, 2, wf, symmetric=False), 3, wh, symmetric=True), 4, ww, symmetric=True
        )
        context = self.context(x)
        pixel_frames = 1 + (wf - 1) * TIME_SCALE
        x_t = _resize(noise, 2, max(pixel_frames, self.cfg.stage5_kernel[0]), symmetric=False)
        pixels = self.denoise(context, x_t)[:, :, :pixel_frames]
        return self._crop(pixels, (f, h, w), (wh, ww))

    @staticmethod
    def _crop(pixels: mx.array, content: tuple[int, int, int], padded: tuple[int, int]) -> mx.array:
        """Back to the content's pixels: trailing frames off, the recorded spatial edge pads off."""
        f, h, w = content
        hb, _ = symmetric_pad(h, padded[0])
        wb, _ = symmetric_pad(w, padded[1])
        x = pixels[:, :, : 1 + (f - 1) * TIME_SCALE]
        return x[
            :, :, :, hb * SPACE_SCALE : (hb + h) * SPACE_SCALE, wb * SPACE_SCALE : (wb + w) * SPACE_SCALE
        ]


def decode_seeded(model: DiffusionVideoDecoder, latent: mx.array, seed: int) -> mx.array:
    """Decode with stage-5 noise drawn from `seed` in the padded latent's pixel shape (what a farm
    decode task and `--local` both do; a keyframe-aware decode calls this per window)."""
    noise = mx.random.normal(model.noise_shape(latent.shape), key=mx.random.key(int(seed)))
    return model(latent, noise)
