"""LTX-2.5's DurationHead: the clip length a prompt implies, from the text connector's outputs.

Follows upstream `ltx_core.duration_head` (ltx-core 1.0.0 predates it): each modality's connector
tokens are projected to the pooler width and tagged with a learned modality embedding, one attention
pooler (learned queries over every token, PyTorch `nn.MultiheadAttention` weights) pools them, and a
tanh-GELU MLP gives a log-duration in seconds. `ltx_engine.rules.duration.frames_for` turns seconds into a
clip length the way upstream's DurationPredictor does (clamp to [1 s, 20 s] in frames, floor to
8k + 1, up again when that undershoots the minimum). Pack keys are the reference's (`duration_head.` stripped).
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn


class AttentionPooler(nn.Module):
    """`num_queries` learned tokens cross-attending every input token (no mask: the connector's
    registers make every token valid). Weights keep nn.MultiheadAttention's packed layout."""

    def __init__(self, hidden: int, num_queries: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.query_tokens = mx.zeros((num_queries, hidden))
        self.cross_attn = nn.Module()
        self.cross_attn.in_proj_weight = mx.zeros((3 * hidden, hidden))
        self.cross_attn.in_proj_bias = mx.zeros((3 * hidden,))
        self.cross_attn.out_proj = nn.Linear(hidden, hidden)

    def _heads(self, x: mx.array) -> mx.array:
        b, n, d = x.shape
        return x.reshape(b, n, self.num_heads, d // self.num_heads).transpose(0, 2, 1, 3)

    def __call__(self, tokens: mx.array) -> mx.array:
        """tokens (B, T, H) -> pooled (B, Q, H)."""
        attn = self.cross_attn
        wq, wk, wv = mx.split(attn.in_proj_weight, 3, axis=0)
        bq, bk, bv = mx.split(attn.in_proj_bias, 3, axis=0)
        queries = mx.broadcast_to(self.query_tokens[None], (tokens.shape[0], *self.query_tokens.shape))
        q, k, v = (self._heads(x @ w.T + b) for x, w, b in ((queries, wq, bq), (tokens, wk, bk), (tokens, wv, bv)))
        scale = 1.0 / math.sqrt(q.shape[-1])
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
        b, _, n, _ = out.shape
        return attn.out_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


class DurationHead(nn.Module):
    """Predicts seconds (B,) from video and/or audio connector tokens (B, T, D)."""

    def __init__(self, video_dim: int = 4096, audio_dim: int = 2048, hidden: int = 256, num_queries: int = 1,
                 num_heads: int = 4, mlp_hidden: int = 256):
        super().__init__()
        self.video_input_proj = nn.Linear(video_dim, hidden)
        self.video_modality_emb = mx.zeros((hidden,))
        self.audio_input_proj = nn.Linear(audio_dim, hidden)
        self.audio_modality_emb = mx.zeros((hidden,))
        self.attention_pooler = AttentionPooler(hidden, num_queries, num_heads)
        self.mlp_hidden = nn.Linear(hidden * num_queries, mlp_hidden)
        self.mlp_out = nn.Linear(mlp_hidden, 1)

    @classmethod
    def from_config(cls, cfg: dict) -> DurationHead:
        """Sizes as upstream's DurationHeadConfigurator: the DiT's context widths, a `duration_head` dict."""
        t, d = cfg.get("transformer", {}), cfg.get("duration_head", {})
        return cls(t.get("cross_attention_dim", 4096), t.get("audio_cross_attention_dim", 2048),
                   d.get("pooler_hidden_dim", 256), d.get("num_queries", 1), d.get("num_pooler_heads", 4),
                   d.get("mlp_hidden", 256))

    @classmethod
    def from_weights(cls, cfg: dict, weights: dict[str, mx.array]) -> DurationHead:
        """The head the tensors describe (projection widths and query count from their shapes)."""
        hidden, video_dim = weights["video_input_proj.weight"].shape
        audio_dim = weights["audio_input_proj.weight"].shape[1]
        queries = weights["attention_pooler.query_tokens"].shape[0]
        mlp_hidden = weights["mlp_hidden.weight"].shape[0]
        heads = cfg.get("duration_head", {}).get("num_pooler_heads", 4)
        return cls(video_dim, audio_dim, hidden, queries, heads, mlp_hidden)

    def __call__(self, video: mx.array | None, audio: mx.array | None) -> mx.array:
        if video is None and audio is None:
            raise ValueError("DurationHead needs video and/or audio connector tokens")
        groups = []
        if video is not None:
            groups.append(self.video_input_proj(video) + self.video_modality_emb)
        if audio is not None:
            groups.append(self.audio_input_proj(audio) + self.audio_modality_emb)
        pooled = self.attention_pooler(mx.concatenate(groups, axis=1))
        hidden = nn.gelu_approx(self.mlp_hidden(pooled.reshape(pooled.shape[0], -1)))
        return mx.exp(self.mlp_out(hidden)[..., 0])
