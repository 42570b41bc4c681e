"""The LTX-2 joint audio-video DiT (video-only and audio-video variants) in MLX.

Mirrors ltx_core.model.transformer (1.2.0): patchify projection, AdaLN-single timestep modulation (6
rows per block, 9 with cross-attention AdaLN), text cross-attention, audio<->video cross-attention whose
scale/shift read the modality's own per-token timesteps and whose gates read the other modality's
sigma, output norm + projection. Module paths equal the keys of
mlx-forge transformer packs (`transformer.` prefix stripped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ltx_engine.models.dit_blocks import (
    NO_SKIP,
    AdaLayerNormSingle,
    BasicAVTransformerBlock,
    BlockSkip,
    StreamArgs,
    StreamDims,
    TextProjection,
    modulation,
)
from ltx_engine.models.rope import parse_rope_type, rope_table
from ltx_engine.rules.guidance import NO_PERTURBATION, Perturbation
from ltx_engine.rules.transformer_keys import _RENAMES, OTHER_COMPONENTS, reference_name  # noqa: F401

AUDIO_VIDEO, VIDEO_ONLY, AUDIO_ONLY = "AudioVideo", "VideoOnly", "AudioOnly"


@dataclass
class TransformerConfig:
    """Sizes and switches of the DiT; defaults equal the reference configurator's."""

    model_type: str = AUDIO_VIDEO
    num_attention_heads: int = 32
    attention_head_dim: int = 128
    in_channels: int = 128
    out_channels: int = 128
    num_layers: int = 48
    cross_attention_dim: int = 4096
    norm_eps: float = 1e-6
    positional_embedding_theta: float = 10000.0
    positional_embedding_max_pos: list[int] = field(default_factory=lambda: [20, 2048, 2048])
    timestep_scale_multiplier: float = 1000
    use_middle_indices_grid: bool = True
    audio_num_attention_heads: int = 32
    audio_attention_head_dim: int = 64
    audio_in_channels: int = 128
    audio_out_channels: int = 128
    audio_cross_attention_dim: int = 2048
    audio_positional_embedding_max_pos: list[int] = field(default_factory=lambda: [20])
    av_ca_timestep_scale_multiplier: float = 1
    rope_type: str = "interleaved"
    double_precision_rope: bool = False
    apply_gated_attention: bool = False
    cross_attention_adaln: bool = False
    caption_channels: int | None = None  # set only when the DiT holds the caption projection (LTX-2.0)
    ff_bias: bool = True                  # LTX-2.5: false (the video FF has no biases)
    audio_ff_bias: bool = True
    use_keyframes_abs_pos_embedding: bool = False  # LTX-2.5: learned marker for single-frame tokens

    @classmethod
    def from_config(cls, cfg: dict, model_type: str | None = None) -> TransformerConfig:
        """Read the checkpoint's embedded config (its `transformer` section)."""
        t = cfg.get("transformer", {})
        d = cls()
        names = [f for f in cls.__dataclass_fields__ if f not in ("model_type", "double_precision_rope",
                                                                 "caption_channels", "rope_type")]
        kwargs = {n: t.get(n, getattr(d, n)) for n in names}
        caption = None if t.get("caption_proj_before_connector", False) else t.get("caption_channels")
        return cls(
            model_type=model_type or d.model_type,
            rope_type=parse_rope_type(t.get("rope_type", d.rope_type)),
            double_precision_rope=t.get("frequencies_precision", False) == "float64",
            caption_channels=caption,
            **kwargs,
        )

    @classmethod
    def from_weights(cls, cfg: dict, weights: dict, model_type: str | None = None) -> TransformerConfig:
        """`from_config`, with switches taken from tensor shapes (a pack's config.json can disagree)."""
        c = cls.from_config(cfg, model_type)
        w = {k.removeprefix("transformer."): v for k, v in weights.items()}
        has_v, has_a = "patchify_proj.weight" in w, "audio_patchify_proj.weight" in w
        if model_type is None and (has_v or has_a):
            c.model_type = AUDIO_VIDEO if has_v and has_a else (VIDEO_ONLY if has_v else AUDIO_ONLY)
        sst = w.get("transformer_blocks.0.scale_shift_table", w.get("transformer_blocks.0.audio_scale_shift_table"))
        if sst is not None:
            c.cross_attention_adaln = sst.shape[0] == 9
        c.ff_bias = "transformer_blocks.0.ff.proj_in.bias" in w or not has_v
        c.audio_ff_bias = "transformer_blocks.0.audio_ff.proj_in.bias" in w or not has_a
        c.use_keyframes_abs_pos_embedding = "keyframes_abs_pos_embedding" in w
        c.apply_gated_attention = any(re.fullmatch(r"transformer_blocks\.0\.(audio_)?attn1\.to_gate_logits\.weight", k)
                                      for k in w)
        layers = {int(m.group(1)) for k in w if (m := re.match(r"transformer_blocks\.(\d+)\.", k))}
        if layers:
            c.num_layers = max(layers) + 1
        if "caption_projection.linear1.bias" in w and "caption_projection.linear1.scales" not in w:
            c.caption_channels = w["caption_projection.linear1.weight"].shape[1]
        elif not any(k.startswith(("caption_projection.", "audio_caption_projection.")) for k in w):
            c.caption_channels = None
        return c

    @property
    def has_video(self) -> bool:
        return self.model_type in (AUDIO_VIDEO, VIDEO_ONLY)

    @property
    def has_audio(self) -> bool:
        return self.model_type in (AUDIO_VIDEO, AUDIO_ONLY)


@dataclass
class Modality:
    """One modality's DiT input.

    latent (B, T, C) tokens (generated then conditioning); sigma (B,) float32 scalar noise level;
    timesteps (B, T) per-token sigma * denoise_mask; positions (B, n_axes, T, 2) float32 [start, end)
    (pixels for H/W, seconds for time); context (B, L, D); context_mask (B, L) 1 = keep (or a float
    additive bias, (B, L) or per query token (B, 1, T, L): Prompt Relay's); attention_mask (B, T, T) in
    [0, 1] or None for full self-attention; keyframes_mask (B, T, 1) or (B, T), non-zero on
    single-pixel-frame tokens (LTX-2.5's keyframe marker; None = no token marked, and models without
    the embedding ignore it).
    """

    latent: mx.array
    sigma: mx.array
    timesteps: mx.array
    positions: mx.array
    context: mx.array
    context_mask: mx.array | None = None
    attention_mask: mx.array | None = None
    enabled: bool = True
    keyframes_mask: mx.array | None = None


def x0_from_velocity(x: mx.array, v: mx.array, timesteps: mx.array) -> mx.array:
    """X0Model: `x - v * timesteps`, timesteps per token (B, T) or per sample (B,), in float32."""
    t = timesteps.astype(mx.float32)
    t = t.reshape(t.shape + (1,) * (x.ndim - t.ndim))
    return (x.astype(mx.float32) - v.astype(mx.float32) * t).astype(x.dtype)


def quantizable(path: str) -> bool:
    """Pack rule: only Linear layers inside `transformer_blocks` are quantized (gate logits too)."""
    return path.removeprefix("transformer.").startswith("transformer_blocks.")


_OTHER_COMPONENTS = OTHER_COMPONENTS


def _additive_context_mask(mask: mx.array | None, dtype: mx.Dtype) -> mx.array | None:
    """1/0 keep mask (B, L) -> (B, 1, 1, L) bias of 0 / -finfo.max, as the reference builds it."""
    if mask is None:
        return None
    if mx.issubdtype(mask.dtype, mx.floating):
        return mask.reshape(mask.shape[0], 1, -1, mask.shape[-1]) if mask.ndim == 2 else mask
    bias = (mask.astype(mx.int32) - 1).astype(dtype) * mx.finfo(dtype).max
    return bias.reshape(mask.shape[0], 1, -1, mask.shape[-1])


def _self_attention_bias(mask: mx.array | None, dtype: mx.Dtype) -> mx.array | None:
    """[0, 1] strengths (B, T, T) -> additive log bias (B, 1, T, T); 0 masks fully."""
    if mask is None:
        return None
    fi = mx.finfo(dtype)
    m = mask.astype(mx.float32)
    bias = mx.where(m > 0, mx.log(mx.maximum(m, np.finfo(np.float32).tiny)), fi.min)
    return bias.astype(dtype)[:, None]


class LTXModel(nn.Module):
    """Velocity model: `(video, audio)` modalities -> per-modality velocity (B, T, C_out)."""

    @classmethod
    def from_config(cls, cfg: dict) -> LTXModel:
        """Built from the embedded (reference) config, as the pack registry builds every model."""
        return cls(TransformerConfig.from_config(cfg))

    def __init__(self, config: TransformerConfig):
        super().__init__()
        c = self.config = config
        self.n_params = 9 if c.cross_attention_adaln else 6
        vdim = c.num_attention_heads * c.attention_head_dim
        adim = c.audio_num_attention_heads * c.audio_attention_head_dim
        video = audio = None
        if c.has_video:
            video = StreamDims(vdim, c.num_attention_heads, c.attention_head_dim, c.cross_attention_dim,
                               ff_bias=c.ff_bias)
            self._init_stream("", c.in_channels, c.out_channels, vdim)
            if c.use_keyframes_abs_pos_embedding:
                self.keyframes_abs_pos_embedding = mx.zeros((1, vdim))
        if c.has_audio:
            audio = StreamDims(adim, c.audio_num_attention_heads, c.audio_attention_head_dim,
                               c.audio_cross_attention_dim, ff_bias=c.audio_ff_bias)
            self._init_stream("audio_", c.audio_in_channels, c.audio_out_channels, adim)
        if c.has_video and c.has_audio:
            self.av_ca_video_scale_shift_adaln_single = AdaLayerNormSingle(vdim, 4)
            self.av_ca_audio_scale_shift_adaln_single = AdaLayerNormSingle(adim, 4)
            self.av_ca_a2v_gate_adaln_single = AdaLayerNormSingle(vdim, 1)
            self.av_ca_v2a_gate_adaln_single = AdaLayerNormSingle(adim, 1)
        self.transformer_blocks = [
            BasicAVTransformerBlock(video, audio, rope_type=c.rope_type, norm_eps=c.norm_eps,
                                    gated=c.apply_gated_attention, cross_attention_adaln=c.cross_attention_adaln)
            for _ in range(c.num_layers)
        ]

    def _init_stream(self, p: str, in_ch: int, out_ch: int, dim: int) -> None:
        self[f"{p}patchify_proj"] = nn.Linear(in_ch, dim)
        if self.config.caption_channels is not None:
            self[f"{p}caption_projection"] = TextProjection(self.config.caption_channels, dim)
        self[f"{p}adaln_single"] = AdaLayerNormSingle(dim, self.n_params)
        if self.config.cross_attention_adaln:
            self[f"{p}prompt_adaln_single"] = AdaLayerNormSingle(dim, 2)
        self[f"{p}scale_shift_table"] = mx.zeros((2, dim))
        self[f"{p}proj_out"] = nn.Linear(dim, out_ch)

    def _stream(self, p: str) -> dict:
        """Per-modality sizes: heads, rope max positions, and which AV adaLNs it owns."""
        c = self.config
        if p:
            return dict(heads=c.audio_num_attention_heads, max_pos=c.audio_positional_embedding_max_pos,
                        ss="av_ca_audio_scale_shift_adaln_single", gate="av_ca_v2a_gate_adaln_single")
        return dict(heads=c.num_attention_heads, max_pos=c.positional_embedding_max_pos,
                    ss="av_ca_video_scale_shift_adaln_single", gate="av_ca_a2v_gate_adaln_single")

    def _prepare(self, m: Modality, other: Modality | None, p: str) -> StreamArgs:
        """The reference's (MultiModal)TransformerArgsPreprocessor.prepare for one modality."""
        c, s = self.config, self._stream(p)
        proj = self[f"{p}patchify_proj"]
        dtype = proj.weight.dtype
        x = proj(m.latent.astype(dtype))
        if not p:
            x = self._mark_keyframes(x, m.keyframes_mask)
        b, dim = x.shape[0], x.shape[-1]
        mult = c.timestep_scale_multiplier
        mod, emb = modulation(self[f"{p}adaln_single"], m.timesteps.astype(mx.float32) * mult, self.n_params, dtype)
        prompt_mod = None
        if c.cross_attention_adaln:
            prompt_mod, _ = modulation(self[f"{p}prompt_adaln_single"],
                                       m.sigma.astype(mx.float32).reshape(b, -1) * mult, 2, dtype)
        context = m.context.astype(dtype)
        if f"{p}caption_projection" in self:
            context = self[f"{p}caption_projection"](context)
        rope = dict(theta=c.positional_embedding_theta, rope_type=c.rope_type,
                    double_precision=c.double_precision_rope, dtype=dtype)
        args = StreamArgs(
            x=x, context=context.reshape(b, -1, dim), context_mask=_additive_context_mask(m.context_mask, dtype),
            mod=mod, embedded_timestep=emb, prompt_mod=prompt_mod,
            pe=rope_table(m.positions, dim=dim, heads=s["heads"], max_pos=s["max_pos"],
                          use_middle_indices_grid=c.use_middle_indices_grid, **rope),
            self_mask=_self_attention_bias(m.attention_mask, dtype),
        )
        if not (c.has_video and c.has_audio) or other is None:
            return args
        self._prepare_cross(args, m, other, s, rope)
        return args

    def _prepare_cross(self, args: StreamArgs, m: Modality, other: Modality, s: dict, rope: dict) -> None:
        """Audio<->video cross-attention inputs of one modality, as ltx-core 1.2.0 prepares them.

        RoPE: time axis only, over the audio width (both directions attend in the audio head layout),
        split into this modality's own head count as the reference does. AdaLN: scale/shift read this
        modality's OWN per-token timesteps; the gate reads the OTHER modality's sigma (1.0.0 fed the
        other sigma to both, which differs on conditioned tokens and frozen streams).
        """
        c, b, dtype = self.config, args.x.shape[0], args.x.dtype
        cross_max = max(c.positional_embedding_max_pos[0], c.audio_positional_embedding_max_pos[0])
        audio_width = c.audio_num_attention_heads * c.audio_attention_head_dim
        args.cross_pe = rope_table(m.positions[:, 0:1], dim=audio_width, heads=s["heads"],
                                   max_pos=[cross_max], use_middle_indices_grid=True, **rope)
        mult = c.timestep_scale_multiplier
        own = m.timesteps.astype(mx.float32).reshape(b, -1) * mult
        args.cross_scale_shift, _ = modulation(self[s["ss"]], own, 4, dtype)
        other_sigma = other.sigma.astype(mx.float32).reshape(b, -1) * mult
        args.cross_gate, _ = modulation(self[s["gate"]], other_sigma * (c.av_ca_timestep_scale_multiplier / mult), 1, dtype)

    def _mark_keyframes(self, x: mx.array, mask: mx.array | None) -> mx.array:
        """LTX-2.5: add the learned keyframe embedding to marked tokens right after patchify_proj, so a
        slot (one pixel frame) reads differently from a latent frame (eight). No-op without it."""
        if mask is None or "keyframes_abs_pos_embedding" not in self:
            return x
        if mask.ndim == 2:
            mask = mask[..., None]
        marked = (mask > 0).astype(x.dtype)
        return x + marked * self.keyframes_abs_pos_embedding.astype(x.dtype)

    def _output(self, p: str, s: StreamArgs) -> mx.array:
        table = self[f"{p}scale_shift_table"].astype(s.x.dtype)
        shift = table[0] + s.embedded_timestep
        scale = table[1] + s.embedded_timestep
        x = mx.fast.layer_norm(s.x, None, None, self.config.norm_eps)
        return self[f"{p}proj_out"](x * (1 + scale) + shift)

    def block_skips(self, perturbation: Perturbation | None) -> list[BlockSkip]:
        """Per-block skips of a perturbed pass; STG or modality blocks outside the model are refused."""
        p = perturbation or NO_PERTURBATION
        n = self.num_blocks
        named = p.video_self_blocks | p.audio_self_blocks | (p.cross_blocks or frozenset())
        outside = sorted(b for b in named if not 0 <= b < n)
        if outside:
            raise ValueError(f"perturbed blocks {outside} outside the model's {n} blocks (0..{n - 1})")
        if p.is_identity():
            return [NO_SKIP] * n
        return [BlockSkip(i in p.video_self_blocks, i in p.audio_self_blocks, *p.skips_cross(i)) for i in range(n)]

    def __call__(self, video: Modality | None, audio: Modality | None, perturbation: Perturbation | None = None,
                 cache=None) -> tuple[mx.array | None, mx.array | None]:
        """Velocities of both modalities; `perturbation` makes it a STG or modality-isolated pass; `cache`
        (`ltx_engine.step_cache.StepCache`) may replay the block stack from an earlier step's residual."""
        c = self.config
        if video is not None and not c.has_video:
            raise ValueError("this model has no video stream")
        if audio is not None and not c.has_audio:
            raise ValueError("this model has no audio stream")
        v, a = self._prepare_streams(video, audio)
        skips = self.block_skips(perturbation)
        if cache is None:
            v, a = self._run_blocks(v, a, skips)
        else:
            v, a = cache.run(self, v, a, lambda v_in, a_in: self._run_blocks(v_in, a_in, skips))
        vx = self._output("", v).astype(video.latent.dtype) if v is not None and not v.frozen else None
        ax = self._output("audio_", a).astype(audio.latent.dtype) if a is not None and not a.frozen else None
        return vx, ax

    def _prepare_streams(self, video: Modality | None, audio: Modality | None) -> tuple:
        """Both streams' block inputs; a disabled one (its guider skips this step) frozen, as upstream's:
        left as it is by the blocks, read by the other's cross-attention, no velocity."""
        if all(m is None or not m.enabled for m in (video, audio)):
            raise ValueError("at least one of video or audio must be enabled")
        v = None if video is None else replace(self._prepare(video, audio, ""), frozen=not video.enabled)
        a = None if audio is None else replace(self._prepare(audio, video, "audio_"), frozen=not audio.enabled)
        return v, a

    @property
    def num_blocks(self) -> int:
        return len(self.transformer_blocks)

    def first_block_gate(self, v: StreamArgs | None, a: StreamArgs | None) -> mx.array:
        """Block 0's modulated self-attention input of the video (else the audio) stream: the step
        cache's signal, `rms(x) * (1 + scale) + shift` as the block computes it, without attention."""
        prefix, s = ("", v) if v is not None else ("audio_", a)
        return self.first_block()._self_in(s, prefix)[0]

    def first_block(self) -> BasicAVTransformerBlock:
        return self.transformer_blocks[0]

    def _run_blocks(self, v: StreamArgs | None, a: StreamArgs | None, skips: list[BlockSkip]) -> tuple:
        """Every block in order (`ltx_engine.loading.streaming` binds them one at a time instead)."""
        for block, skip in zip(self.transformer_blocks, skips, strict=True):
            v, a = block(v, a, skip)
        return v, a

    @staticmethod
    def sanitize(weights: dict) -> dict[str, mx.array]:
        """Reference state dict (prefix `model.diffusion_model.` stripped or not) -> pack key names.

        Connector tensors that share the reference prefix belong to the connector component and are
        dropped here. Everything in the DiT is Linear or a table, so no layout changes.
        """
        out = {}
        for key, value in weights.items():
            k = key.removeprefix("model.diffusion_model.")
            if k.startswith(_OTHER_COMPONENTS):
                continue
            k = "." + k
            for old, new in _RENAMES:
                k = k.replace(old, new)
            out[k[1:]] = value if isinstance(value, mx.array) else mx.array(np.asarray(value))
        return out


def tiny_config() -> dict:
    """`transformer` section of the TINY pack: the 2.3 layout (split float64 RoPE, gated attention,
    cross-attention AdaLN, no caption projection) at tiny widths. Every Linear input width inside the
    blocks is a multiple of 32, so q8/q4 packs quantize every block Linear at group size 32."""
    return {
        "num_attention_heads": 2, "attention_head_dim": 32, "in_channels": 128, "out_channels": 128,
        "num_layers": 2, "cross_attention_dim": 64, "norm_eps": 1e-6,
        "audio_num_attention_heads": 2, "audio_attention_head_dim": 16, "audio_in_channels": 128,
        "audio_out_channels": 128, "audio_cross_attention_dim": 32,
        "positional_embedding_theta": 10000.0, "positional_embedding_max_pos": [20, 2048, 2048],
        "audio_positional_embedding_max_pos": [20], "timestep_scale_multiplier": 1000,
        "av_ca_timestep_scale_multiplier": 1000, "use_middle_indices_grid": True,
        "rope_type": "split", "frequencies_precision": "float64", "apply_gated_attention": True,
        "cross_attention_adaln": True, "caption_proj_before_connector": True,
        # Fixed values the reference configurator checks.
        "dropout": 0.0, "attention_bias": True, "num_vector_embeds": None, "activation_fn": "gelu-approximate",
        "num_embeds_ada_norm": 1000, "use_linear_projection": False, "only_cross_attention": False,
        "cross_attention_norm": True, "double_self_attention": False, "upcast_attention": False,
        "standardization_norm": "rms_norm", "norm_elementwise_affine": False, "qk_norm": "rms_norm",
        "positional_embedding_type": "rope", "use_audio_video_cross_attention": True, "share_ff": False,
        "av_cross_ada_norm": True,
    }
