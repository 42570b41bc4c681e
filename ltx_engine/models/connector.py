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
import re
from dataclasses import dataclass, field, replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np

# Keys of a V2 (LTX-2.3) embedded config and the values the reference accepts.
_V2_EXPECTED = {
    "caption_proj_before_connector": True,
    "caption_projection_first_linear": False,
    "caption_proj_input_norm": False,
    "caption_projection_second_linear": False,
}


@dataclass
class ConnectorConfig:
    """Sizes of the feature extractor and both connectors, from the checkpoint's embedded config."""

    video_dim: int = 4096
    audio_dim: int = 2048
    text_features: int = 3840 * 49  # Gemma width x hidden states (layers + 1), flattened per token
    video_heads: int = 30
    video_head_dim: int = 128
    video_layers: int = 2
    audio_heads: int = 30
    audio_head_dim: int = 128
    audio_layers: int = 2
    num_learnable_registers: int = 128
    rope_type: str = "interleaved"
    double_precision_rope: bool = False
    positional_embedding_max_pos: list[int] = field(default_factory=lambda: [1])
    positional_embedding_theta: float = 10000.0
    gated_attention: bool = False
    norm_eps: float = 1e-6
    ff_bias: bool = True        # LTX-2.5 connectors' feed-forwards have no biases (`connector_ff_bias`)
    projection: bool = True     # LTX-2.5 keeps the aggregate embeds in its Gemma 4 tower file instead

    @classmethod
    def from_config(cls, cfg: dict) -> ConnectorConfig:
        """Read the reference keys of `cfg["transformer"]` (defaults equal the reference's).

        Gemma's width and depth are not in the reference config (it reads them from the Gemma it
        loads; Gemma 3 12B: 3840 wide, 48 layers); `text_encoder_hidden_size` /
        `text_encoder_num_hidden_layers` override them. `from_weights` takes them from the tensors.
        """
        t = cfg.get("transformer", {})
        present = t.keys() & _V2_EXPECTED.keys()
        if present != _V2_EXPECTED.keys() or any(t[k] != _V2_EXPECTED[k] for k in present):
            raise NotImplementedError(
                "only the LTX-2.3 (V2) text projection is supported; config lacks or differs in "
                + ", ".join(sorted(_V2_EXPECTED))
            )
        heads = t.get("connector_num_attention_heads", 30)
        head_dim = t.get("connector_attention_head_dim", 128)
        layers = t.get("connector_num_layers", 2)
        return cls(
            video_dim=t.get("num_attention_heads", 32) * t.get("attention_head_dim", 128),
            audio_dim=t.get("audio_num_attention_heads", 32) * t.get("audio_attention_head_dim", 64),
            text_features=t.get("text_encoder_hidden_size", 3840) * (t.get("text_encoder_num_hidden_layers", 48) + 1),
            video_heads=heads,
            video_head_dim=head_dim,
            video_layers=layers,
            audio_heads=t.get("audio_connector_num_attention_heads", heads),
            audio_head_dim=t.get("audio_connector_attention_head_dim", head_dim),
            audio_layers=t.get("audio_connector_num_layers", layers),
            num_learnable_registers=t.get("connector_num_learnable_registers", 128),
            rope_type=t.get("rope_type", "interleaved"),
            double_precision_rope=t.get("frequencies_precision", False) == "float64",
            positional_embedding_max_pos=list(t.get("connector_positional_embedding_max_pos", [1])),
            gated_attention=t.get("connector_apply_gated_attention", False),
            ff_bias=t.get("connector_ff_bias", True),
        )


    @classmethod
    def from_weights(cls, cfg: dict, weights: dict[str, mx.array]) -> ConnectorConfig:
        """`from_config`, then every size the tensors fix taken from them (model keys).

        A pack converted with another Gemma, or whose config keys are stale, still loads: the text
        width (Gemma width x hidden states), output widths, connector depth, head width, registers and
        gating come from the shapes. Head counts come from the gate logits when the attention is
        gated, else from the config (a plain q/k/v shape cannot tell heads from head width).
        """
        c = cls.from_config(cfg)
        sizes: dict = {}
        for stream in ("video", "audio"):
            shape = _linear_shape(weights, f"text_embedding_projection.{stream}_aggregate_embed")
            if shape is not None:
                sizes[f"{stream}_dim"] = shape[0]
                if shape[1] is not None:
                    sizes["text_features"] = shape[1]
            sizes.update(_connector_sizes(weights, stream, getattr(c, f"{stream}_heads")))
        if any(k.startswith(("video_embeddings_connector.", "audio_embeddings_connector.")) for k in weights):
            registers = weights.get("video_embeddings_connector.learnable_registers")
            sizes["num_learnable_registers"] = 0 if registers is None else registers.shape[0]
            sizes["gated_attention"] = any(".attn1.to_gate_logits." in k for k in weights)
            sizes["ff_bias"] = any(k.endswith(".ff.net.0.proj.bias") for k in weights)
        sizes["projection"] = any(k.startswith("text_embedding_projection.") for k in weights)
        return replace(c, **sizes)


def _linear_shape(weights: dict[str, mx.array], path: str) -> tuple[int, int | None] | None:
    """(out, in) of a Linear's weight; `in` is None when quantized (the packed width hides it)."""
    w = weights.get(f"{path}.weight")
    if w is None:
        return None
    return w.shape[0], None if f"{path}.scales" in weights else w.shape[1]


def _connector_sizes(weights: dict[str, mx.array], stream: str, heads: int) -> dict:
    """Depth, heads and head width of one embeddings connector, from its tensors."""
    prefix = f"{stream}_embeddings_connector.transformer_1d_blocks."
    blocks = {int(m.group(1)) for k in weights if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    if not blocks:
        return {}
    gate = weights.get(f"{prefix}0.attn1.to_gate_logits.weight")
    heads = heads if gate is None else gate.shape[0]
    q = _linear_shape(weights, f"{prefix}0.attn1.to_q")
    sizes = {f"{stream}_layers": max(blocks) + 1}
    if q is not None:
        if q[0] % heads:
            raise ValueError(f"{prefix}0.attn1.to_q.weight: width {q[0]} does not split into {heads} heads")
        sizes.update({f"{stream}_heads": heads, f"{stream}_head_dim": q[0] // heads})
    return sizes


def tiny_connector_config(gemma_hidden: int, gemma_layers: int, video_dim: int, audio_dim: int) -> dict:
    """Embedded-config `transformer` fields for a tiny pack's text path (merge into that section).

    Video and audio use the same head count (as the reference configurator does); the connector
    widths equal the DiT's video / audio widths because the projection feeds the connectors.
    """
    heads = 2
    return {
        "caption_proj_before_connector": True,
        "caption_projection_first_linear": False,
        "caption_proj_input_norm": False,
        "caption_projection_second_linear": False,
        "num_attention_heads": heads,
        "attention_head_dim": video_dim // heads,
        "audio_num_attention_heads": heads,
        "audio_attention_head_dim": audio_dim // heads,
        "connector_num_attention_heads": heads,
        "connector_attention_head_dim": video_dim // heads,
        "connector_num_layers": 2,
        "audio_connector_num_attention_heads": heads,
        "audio_connector_attention_head_dim": audio_dim // heads,
        "audio_connector_num_layers": 2,
        "connector_positional_embedding_max_pos": [4096],
        "connector_apply_gated_attention": True,
        "rope_type": "split",
        "frequencies_precision": "float64",
        "text_encoder_hidden_size": gemma_hidden,
        "text_encoder_num_hidden_layers": gemma_layers,
    }


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
