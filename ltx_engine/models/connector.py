"""LTX-2.3 text path after Gemma: feature extractor (V2) and the video / audio embeddings connectors.

Mirrors the reference `EmbeddingsProcessor.process_hidden_states`: Gemma's per-layer hidden states
are RMS-normalised per token and layer, flattened (layer index fastest), projected by
`text_embedding_projection.{video,audio}_aggregate_embed` to the DiT's video / audio widths, and
each stream is refined by an `Embeddings1DConnector` (1D transformer with SPLIT RoPE, learnable
registers that replace the padded tokens, affine-free RMS pre-norms). Module paths equal the keys
of a pack's `connector.safetensors` with the `connector.` prefix stripped (PyTorch `to_out.0` and
`ff.net.*` names are kept), so real packs load without renaming. LTX-2.5's connector differs only in
its feed-forwards (no biases, `connector_ff_bias`) and keeps no projection: its aggregate embeds ship
in the Gemma 4 tower's file, and the tower hands them in (`TextConnector.__call__(projection=)`).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ltx_engine.models.connector_config import ConnectorConfig


def _rms(x: mx.array, eps: float = 1e-6) -> mx.array:
    """Affine-free RMS norm over the last axis (the reference's `rms_norm` without weight)."""
    return mx.fast.rms_norm(x, None, eps)


def rope_cos_sin(cfg: ConnectorConfig, length: int, inner_dim: int, heads: int) -> tuple[mx.array, mx.array]:
    """1D RoPE tables for positions 0..length-1, float32, as the reference's `precompute_freqs_cis`.

    SPLIT: (1, heads, L, head_dim/2); INTERLEAVED: (1, L, inner_dim).
    """
    max_pos = cfg.positional_embedding_max_pos
    if len(max_pos) != 1:
        raise ValueError(f"connector positions are 1D, max_pos {max_pos} is not")
    theta = cfg.positional_embedding_theta
    n = inner_dim // 2
    exps = np.linspace(0.0, 1.0, n, dtype=np.float64 if cfg.double_precision_rope else np.float32)
    grid = (np.power(theta, exps) * (math.pi / 2)).astype(np.float32)
    pos = mx.arange(length, dtype=mx.float32) / max_pos[0]
    freqs = mx.array(grid)[None, :] * (pos * 2 - 1)[:, None]  # (L, n)
    cos, sin = mx.cos(freqs), mx.sin(freqs)
    if cfg.rope_type == "split":
        cos = cos.reshape(1, length, heads, -1).transpose(0, 2, 1, 3)
        sin = sin.reshape(1, length, heads, -1).transpose(0, 2, 1, 3)
        return cos, sin
    if cfg.rope_type != "interleaved":
        raise ValueError(f"unknown rope_type {cfg.rope_type!r}")
    cos, sin = mx.repeat(cos, 2, axis=-1), mx.repeat(sin, 2, axis=-1)
    pad = inner_dim % 2
    if pad:
        cos = mx.concatenate([mx.ones((length, pad)), cos], axis=-1)
        sin = mx.concatenate([mx.zeros((length, pad)), sin], axis=-1)
    return cos[None], sin[None]


def _apply_rope(x: mx.array, cos: mx.array, sin: mx.array, rope_type: str, heads: int) -> mx.array:
    """Rotate (B, L, H*D) features; SPLIT rotates the two halves of each head, INTERLEAVED pairs."""
    b, length, inner = x.shape
    if rope_type == "split":
        xh = x.reshape(b, length, heads, -1).transpose(0, 2, 1, 3)
        half = xh.shape[-1] // 2
        x1, x2 = xh[..., :half], xh[..., half:]
        out = mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return out.transpose(0, 2, 1, 3).reshape(b, length, inner)
    pairs = x.reshape(b, length, inner // 2, 2)
    rot = mx.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(b, length, inner)
    return x * cos + rot * sin


class ConnectorAttention(nn.Module):
    """Self-attention with RMS-normed q/k over the full width, RoPE and optional per-head gates."""

    def __init__(self, dim: int, heads: int, head_dim: int, gated: bool, eps: float):
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.head_dim = head_dim
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.q_norm = nn.RMSNorm(inner, eps=eps)
        self.k_norm = nn.RMSNorm(inner, eps=eps)
        if gated:
            self.to_gate_logits = nn.Linear(dim, heads)
        self.to_out = [nn.Linear(inner, dim)]

    def __call__(self, x: mx.array, rope: tuple[mx.array, mx.array], rope_type: str) -> mx.array:
        b, length, _ = x.shape
        q = _apply_rope(self.q_norm(self.to_q(x)), *rope, rope_type, self.heads)
        k = _apply_rope(self.k_norm(self.to_k(x)), *rope, rope_type, self.heads)
        v = self.to_v(x)
        q, k, v = (t.reshape(b, length, self.heads, -1).transpose(0, 2, 1, 3) for t in (q, k, v))
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.head_dim**-0.5)
        out = out.transpose(0, 2, 1, 3)  # (B, L, H, D)
        if "to_gate_logits" in self:
            out = out * (2.0 * mx.sigmoid(self.to_gate_logits(x)))[..., None]
        return self.to_out[0](out.reshape(b, length, -1))


class GELUProjection(nn.Module):
    """`ff.net.0`: Linear then tanh-approximated GELU."""

    def __init__(self, dim: int, inner: int, bias: bool = True):
        super().__init__()
        self.proj = nn.Linear(dim, inner, bias=bias)

    def __call__(self, x: mx.array) -> mx.array:
        return nn.gelu_approx(self.proj(x))


class FeedForward(nn.Module):
    """`ff.net = [GELUProjection, Identity, Linear]` with the reference's 4x width."""

    def __init__(self, dim: int, mult: int = 4, bias: bool = True):
        super().__init__()
        self.net = [GELUProjection(dim, dim * mult, bias), nn.Identity(), nn.Linear(dim * mult, dim, bias=bias)]

    def __call__(self, x: mx.array) -> mx.array:
        for layer in self.net:
            x = layer(x)
        return x


class ConnectorBlock(nn.Module):
    """Pre-norm (affine-free RMS) attention and feed-forward, each with a residual."""

    def __init__(self, dim: int, heads: int, head_dim: int, gated: bool, eps: float, ff_bias: bool = True):
        super().__init__()
        self.attn1 = ConnectorAttention(dim, heads, head_dim, gated, eps)
        self.ff = FeedForward(dim, bias=ff_bias)

    def __call__(self, x: mx.array, rope: tuple[mx.array, mx.array], rope_type: str) -> mx.array:
        x = x + self.attn1(_rms(x), rope, rope_type)
        return x + self.ff(_rms(x))


class EmbeddingsConnector(nn.Module):
    """1D transformer that refines projected text features; padded tokens become learnable registers."""

    def __init__(self, cfg: ConnectorConfig, heads: int, head_dim: int, layers: int):
        super().__init__()
        self.cfg = cfg
        self.heads = heads
        self.inner_dim = heads * head_dim
        if cfg.num_learnable_registers:
            self.learnable_registers = mx.zeros((cfg.num_learnable_registers, self.inner_dim))
        self.transformer_1d_blocks = [
            ConnectorBlock(self.inner_dim, heads, head_dim, cfg.gated_attention, cfg.norm_eps, cfg.ff_bias)
            for _ in range(layers)
        ]

    def _with_registers(self, x: mx.array, mask: mx.array) -> mx.array:
        """Move valid tokens to the front (order kept), fill the rest with the tiled registers."""
        b, length, _ = x.shape
        n_reg = self.learnable_registers.shape[0]
        if length % n_reg:
            raise ValueError(f"sequence length {length} is not a multiple of {n_reg} learnable registers")
        registers = mx.tile(self.learnable_registers, (length // n_reg, 1)).astype(x.dtype)
        valid = mask.astype(mx.int32)
        # Stable order: valid tokens first (by position), then padded ones.
        order = mx.argsort((1 - valid) * length + mx.arange(length)[None], axis=1)
        gathered = mx.take_along_axis(x, order[..., None], axis=1)
        keep = (mx.arange(length)[None] < valid.sum(axis=1, keepdims=True))[..., None]
        return mx.where(keep, gathered, registers[None])

    def __call__(self, x: mx.array, mask: mx.array) -> tuple[mx.array, mx.array]:
        """x (B, L, D), binary mask (B, L) -> refined (B, L, D) and the mask of valid outputs."""
        if self.cfg.num_learnable_registers:
            x = self._with_registers(x, mask)
            mask = mx.ones_like(mask)
        elif not bool(mask.all()):
            raise NotImplementedError("padding without learnable registers is not supported")
        rope = rope_cos_sin(self.cfg, x.shape[1], self.inner_dim, self.heads)
        for block in self.transformer_1d_blocks:
            x = block(x, rope, self.cfg.rope_type)
        return _rms(x), mask


class TextProjection(nn.Module):
    """Feature extractor V2: per-token RMS norm per layer, rescale, dual aggregate projections."""

    def __init__(self, cfg: ConnectorConfig):
        super().__init__()
        self.text_features = cfg.text_features
        self.video_aggregate_embed = nn.Linear(cfg.text_features, cfg.video_dim)
        self.audio_aggregate_embed = nn.Linear(cfg.text_features, cfg.audio_dim)

    def _check(self, layers: int, dim: int) -> None:
        """The text encoder must be the one the pack's connector was trained on: say so in one line."""
        if layers * dim != self.text_features:
            want = f"{self.text_features // dim} hidden states" if self.text_features % dim == 0 else "another width"
            raise ValueError(f"the connector reads {self.text_features} text features per token ({want} of width "
                             f"{dim}); the text encoder gave {layers} hidden states x {dim}")

    def __call__(self, hidden_states: list[mx.array], mask: mx.array) -> tuple[mx.array, mx.array]:
        self._check(len(hidden_states), hidden_states[0].shape[-1])
        stacked = mx.stack(hidden_states, axis=-1).astype(mx.float32)  # (B, L, D, layers)
        b, length, dim, layers = stacked.shape
        normed = stacked * mx.rsqrt(mx.mean(stacked * stacked, axis=2, keepdims=True) + 1e-6)
        normed = normed.reshape(b, length, dim * layers) * mask[..., None].astype(mx.float32)
        out = []
        for proj in (self.video_aggregate_embed, self.audio_aggregate_embed):
            scale = math.sqrt(proj.weight.shape[0] / dim)
            out.append(proj((normed * scale).astype(hidden_states[0].dtype)))
        return out[0], out[1]


class TextConnector(nn.Module):
    """Gemma hidden states -> (video context, audio context, context mask) for the DiT."""

    @classmethod
    def from_config(cls, cfg: dict) -> TextConnector:
        """Built from the embedded (reference) config, as the pack registry builds every model."""
        return cls(ConnectorConfig.from_config(cfg))

    @classmethod
    def from_weights(cls, cfg: dict, weights: dict[str, mx.array]) -> TextConnector:
        """Built at the sizes its tensors have (what the registry uses; config keys are the fallback)."""
        return cls(ConnectorConfig.from_weights(cfg, weights))

    def __init__(self, cfg: ConnectorConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.projection:
            self.text_embedding_projection = TextProjection(cfg)
        self.video_embeddings_connector = EmbeddingsConnector(cfg, cfg.video_heads, cfg.video_head_dim, cfg.video_layers)
        self.audio_embeddings_connector = EmbeddingsConnector(cfg, cfg.audio_heads, cfg.audio_head_dim, cfg.audio_layers)

    def __call__(self, hidden_states: list[mx.array], mask: mx.array,
                 projection: TextProjection | None = None) -> tuple[mx.array, mx.array, mx.array]:
        """hidden_states: one (B, L, D) array per Gemma hidden state; mask (B, L), 1 = real token.
        `projection`: the feature extractor of a text tower that carries its own (LTX-2.5's Gemma 4),
        for a connector file without one."""
        projection = self.text_embedding_projection if self.cfg.projection else projection
        if projection is None:
            raise ValueError("the pack's connector has no text_embedding_projection and its text encoder brings none "
                             "(an LTX-2.5 connector needs the pack's Gemma 4 tower)")
        video, audio = projection(hidden_states, mask)
        video, video_mask = self.video_embeddings_connector(video, mask)
        audio, _ = self.audio_embeddings_connector(audio, mask)
        video = video * video_mask[..., None].astype(video.dtype)
        return video, audio, video_mask

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Official checkpoint keys -> ours: drop `model.diffusion_model.`; pack keys pass unchanged.

        Other components' tensors of a full checkpoint are skipped; anything else passes through so
        that the strict loader names it. Layouts are Linear (O, I) or vectors, as in PyTorch.
        """
        ours = ("video_embeddings_connector.", "audio_embeddings_connector.", "text_embedding_projection.")
        others = ("model.diffusion_model.", "vae.", "audio_vae.", "vocoder.")
        out = {}
        for key, value in weights.items():
            short = key.removeprefix("model.diffusion_model.")
            if short.startswith(ours) or not key.startswith(others):
                out[short] = value
        return out


def tiny_connector_weights(cfg: ConnectorConfig, seed: int) -> dict[str, mx.array]:
    """Seeded float32 weights for every tensor of `TextConnector(cfg)` (our key names, no prefix).

    Scaled by fan-in so activations stay O(1); used to write a tiny pack's connector file.
    """
    from mlx.utils import tree_flatten

    rng = np.random.default_rng(seed)
    out = {}
    for key, value in sorted(tree_flatten(TextConnector(cfg).parameters())):
        fan_in = value.shape[-1] if value.ndim == 2 and not key.endswith("learnable_registers") else 1
        std = 0.1 if value.ndim == 1 else fan_in**-0.5
        base = 1.0 if key.endswith("norm.weight") else 0.0
        out[key] = mx.array(base + rng.standard_normal(value.shape).astype(np.float32) * std)
    return out
