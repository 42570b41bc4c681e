"""Building blocks of the LTX-2 DiT: timestep embedding, AdaLN-single, attention, feed-forward, AV block.

Attribute names equal the reference's PyTorch names after the pack converter's renames
(`to_out.0` -> `to_out`, `ff.net.0.proj` -> `ff.proj_in`, `ff.net.2` -> `ff.proj_out`,
`linear_1` -> `linear1`), so real packs load by key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ltx_engine.models import compute, sparse_attention
from ltx_engine.models.rope import SPLIT, RopeTable, apply_interleaved, apply_split, apply_split_flat

TIMESTEP_PROJ_DIM = 256  # sinusoidal width the reference's PixArt embedding always uses


def timestep_sinusoid(t: mx.array, dim: int = TIMESTEP_PROJ_DIM, max_period: float = 10000.0) -> mx.array:
    """(N,) -> (N, dim) embedding, cos first (flip_sin_to_cos=True, downscale_freq_shift=0)."""
    half = dim // 2
    exponent = -math.log(max_period) * mx.arange(half, dtype=mx.float32) / half
    emb = t.astype(mx.float32)[:, None] * mx.exp(exponent)[None, :]
    return mx.concatenate([mx.cos(emb), mx.sin(emb)], axis=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels: int, dim: int):
        super().__init__()
        self.linear1 = nn.Linear(in_channels, dim)
        self.linear2 = nn.Linear(dim, dim)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear2(nn.silu(self.linear1(x)))


class CombinedTimestepEmbedding(nn.Module):
    """Holds `timestep_embedder` so keys read `emb.timestep_embedder.linear1.*`."""

    def __init__(self, dim: int):
        super().__init__()
        self.timestep_embedder = TimestepEmbedding(TIMESTEP_PROJ_DIM, dim)

    def __call__(self, t: mx.array) -> mx.array:
        proj = timestep_sinusoid(t).astype(self.timestep_embedder.linear1.weight.dtype)
        if proj.dtype not in (mx.float32, mx.float16, mx.bfloat16):  # quantized weights are uint32
            proj = proj.astype(mx.float32)
        return self.timestep_embedder(proj)


class AdaLayerNormSingle(nn.Module):
    """adaLN-single: sigma -> (coefficient*dim modulation, dim embedding)."""

    def __init__(self, dim: int, coefficient: int):
        super().__init__()
        self.emb = CombinedTimestepEmbedding(dim)
        self.linear = nn.Linear(dim, coefficient * dim)

    def __call__(self, t: mx.array) -> tuple[mx.array, mx.array]:
        embedded = self.emb(t)
        return self.linear(nn.silu(embedded)), embedded


class TextProjection(nn.Module):
    """PixArt caption projection (LTX-2.0 checkpoints only; 2.3 projects in the connector)."""

    def __init__(self, in_features: int, hidden: int):
        super().__init__()
        self.linear1 = nn.Linear(in_features, hidden)
        self.linear2 = nn.Linear(hidden, hidden)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear2(nn.gelu_approx(self.linear1(x)))


class Modulation:
    """AdaLN modulation rows per token, kept deduplicated.

    Per-token timesteps take few distinct values (conditioning tokens at 0, the rest at sigma), so
    the (B*T, P*D) projection is held as its U distinct rows plus an index, and expanded one
    parameter slice at a time where a block reads it. A gather commutes with the table add.
    """

    def __init__(self, rows: mx.array, inverse: mx.array | None, batch: int, tokens: int, num_params: int):
        self.rows = rows
        self.inverse = inverse
        self.batch, self.tokens, self.num_params = batch, tokens, num_params

    def values(self, table: mx.array, start: int, stop: int) -> list[mx.array]:
        """`table[start:stop] + modulation[start:stop]` as a list of (B, T, D) arrays."""
        dim = table.shape[-1]
        v = self.rows.reshape(-1, self.num_params, dim)[:, start:stop]
        v = v + table[start:stop].astype(v.dtype)
        if self.inverse is not None:
            v = mx.take(v, self.inverse, axis=0)
        v = v.reshape(self.batch, -1, stop - start, dim)
        return [v[:, :, i] for i in range(stop - start)]


def modulation(adaln: AdaLayerNormSingle, t: mx.array, num_params: int, dtype: mx.Dtype) -> tuple:
    """Run `adaln` on the distinct values of `t` (B, T) -> (Modulation, embedded (B, T, D))."""
    b, n = t.shape[0], int(np.prod(t.shape[1:])) if t.ndim > 1 else 1
    flat = np.asarray(t.astype(mx.float32)).reshape(-1)
    uniq, inverse = np.unique(flat, return_inverse=True)
    if len(uniq) < len(flat):
        inv = mx.array(inverse.astype(np.int32))
        rows, emb = adaln(mx.array(uniq))
        embedded = mx.take(emb, inv, axis=0).reshape(b, n, -1)
    else:
        inv = None
        rows, emb = adaln(mx.array(flat))
        embedded = emb.reshape(b, n, -1)
    return Modulation(rows.astype(dtype), inv, b, n, num_params), embedded.astype(dtype)


class FeedForward(nn.Module):
    """GELU(tanh) MLP; LTX-2.5 checkpoints drop the video stream's biases (`ff_bias: false`)."""

    def __init__(self, dim: int, dim_out: int, mult: int = 4, bias: bool = True):
        super().__init__()
        self.proj_in = nn.Linear(dim, int(dim * mult), bias=bias)
        self.proj_out = nn.Linear(int(dim * mult), dim_out, bias=bias)

    def __call__(self, x: mx.array) -> mx.array:
        dt = getattr(self, "_compute", None)  # `ltx_engine.models.forward_options`: a narrower compute dtype
        if dt is None:
            return self.proj_out(nn.gelu_approx(self.proj_in(x)))
        return compute.linear(self.proj_out, nn.gelu_approx(compute.linear(self.proj_in, x, dt)), dt).astype(x.dtype)


class Attention(nn.Module):
    """Multi-head attention with RMS-normed q/k over all heads, RoPE and optional per-head gates."""

    def __init__(self, query_dim: int, context_dim: int | None, heads: int, dim_head: int,
                 norm_eps: float, rope_type: str, gated: bool):
        super().__init__()
        inner = heads * dim_head
        context_dim = query_dim if context_dim is None else context_dim
        self.heads, self.dim_head, self.rope_type, self.eps = heads, dim_head, rope_type, norm_eps
        self.q_norm = nn.RMSNorm(inner, eps=norm_eps)
        self.k_norm = nn.RMSNorm(inner, eps=norm_eps)
        self.to_q = nn.Linear(query_dim, inner)
        self.to_k = nn.Linear(context_dim, inner)
        self.to_v = nn.Linear(context_dim, inner)
        if gated:
            self.to_gate_logits = nn.Linear(query_dim, heads)
        self.to_out = nn.Linear(inner, query_dim)

    def _heads(self, x: mx.array) -> mx.array:
        b, t, _ = x.shape
        return x.reshape(b, t, self.heads, self.dim_head).transpose(0, 2, 1, 3)

    def _rope(self, x: mx.array, pe: RopeTable | None) -> mx.array:
        """x flat (B, T, inner) -> heads layout (B, H, T, Dh), rotated.

        A SPLIT table built for another head count (the video side of the audio<->video attentions,
        when video heads != audio heads) rotates the flat features cut into ITS head count, as the
        reference's `apply_split_rotary_emb` does; then they are cut into this attention's heads.
        """
        if pe is None:
            return self._heads(x)
        if pe.kind == SPLIT and pe.cos.shape[1] != self.heads:
            return self._heads(apply_split_flat(x, pe))
        if pe.kind == SPLIT:
            return apply_split(self._heads(x), pe)
        return self._heads(apply_interleaved(x, pe))

    def __call__(self, x: mx.array, context: mx.array | None = None, mask: mx.array | None = None,
                 pe: RopeTable | None = None, k_pe: RopeTable | None = None, skip: bool = False) -> mx.array:
        """`skip` (STG): the value projection passes through in place of attention; gates still apply."""
        self_attention = context is None
        context = x if context is None else context
        if skip:
            b, t = x.shape[:2]
            values = compute.linear(self.to_v, context, self._dtype())
            return self._output(values.reshape(b, t, self.heads, self.dim_head), x)
        k, v = self.project_kv(context, pe if k_pe is None else k_pe)
        return self.attend(x, self.project_q(x, pe), k, v, mask, self_attention)

    def _dtype(self) -> mx.Dtype | None:
        """The compute dtype set for this forward by `ltx_engine.models.forward_options` (None: the weights')."""
        return getattr(self, "_compute", None)

    def project_q(self, x: mx.array, pe: RopeTable | None) -> mx.array:
        """Queries (B, H, T, Dh): normed, rotated. Row-local, so a shard of x gives a shard of q."""
        dt = self._dtype()
        q = self._rope(compute.rms_norm(self.q_norm, compute.linear(self.to_q, x, dt), dt), pe)
        return q if dt is None else q.astype(dt)

    def project_kv(self, context: mx.array, pe: RopeTable | None) -> tuple[mx.array, mx.array]:
        """Keys (normed, rotated) and values (B, H, T, Dh) of `context`; row-local like the queries
        (`ltx_engine.parallel.sequence_parallel` computes them per shard and gathers them)."""
        dt = self._dtype()
        k = self._rope(compute.rms_norm(self.k_norm, compute.linear(self.to_k, context, dt), dt), pe)
        return (k if dt is None else k.astype(dt)), self._heads(compute.linear(self.to_v, context, dt))

    def attend(self, x: mx.array, q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None,
               self_attention: bool = False) -> mx.array:
        """Attention of the queries over (k, v), the per-head gates read from x, the output projection."""
        return self._output(self._attend(q, k, v, mask, self_attention).transpose(0, 2, 1, 3), x)

    def _output(self, out: mx.array, x: mx.array) -> mx.array:
        """Heads output (B, T, H, Dh) -> per-head gates (when gated) -> output projection."""
        dt = self._dtype()
        if "to_gate_logits" in self:
            gates = 2.0 * mx.sigmoid(compute.linear(self.to_gate_logits, x, dt))
            out = out * gates[..., None].astype(out.dtype)
        b, t = out.shape[:2]
        y = compute.linear(self.to_out, out.reshape(b, t, -1), dt)
        return y if dt is None else y.astype(x.dtype)

    def _attend(self, q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None, self_attention: bool) -> mx.array:
        """The attention kernel; an unmasked self-attention with a routing set (stage 2's attn1) may run sparse."""
        scale = 1.0 / math.sqrt(self.dim_head)
        routing = getattr(self, "_sparse", None)
        if mask is None and self_attention and routing is not None:
            return sparse_attention.attend(q, k, v, scale, routing)
        if mask is not None:
            mask = mask.astype(q.dtype)
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


@dataclass(frozen=True)
class BlockSkip:
    """What one block skips in a perturbed pass (STG self-attention, modality-isolating cross-attention)."""

    video_self: bool = False
    audio_self: bool = False
    a2v: bool = False
    v2a: bool = False


NO_SKIP = BlockSkip()


@dataclass
class StreamArgs:
    """One modality's inputs to every block (the reference's TransformerArgs)."""

    x: mx.array
    context: mx.array
    context_mask: mx.array | None
    mod: Modulation
    embedded_timestep: mx.array
    pe: RopeTable
    prompt_mod: Modulation | None = None
    self_mask: mx.array | None = None
    cross_pe: RopeTable | None = None
    cross_scale_shift: Modulation | None = None
    cross_gate: Modulation | None = None
    frozen: bool = False  # upstream's `Modality.enabled=False`: no block updates it; the other stream still reads it


@dataclass
class StreamDims:
    """Width of one modality's stream inside the blocks."""

    dim: int
    heads: int
    d_head: int
    context_dim: int
    ff_bias: bool = True


def _rms(x: mx.array, eps: float) -> mx.array:
    return mx.fast.rms_norm(x, None, eps)


class BasicAVTransformerBlock(nn.Module):
    """One joint block: self-attn, text cross-attn, audio<->video cross-attn, FF per modality."""

    def __init__(self, video: StreamDims | None, audio: StreamDims | None, *, rope_type: str,
                 norm_eps: float, gated: bool, cross_attention_adaln: bool):
        super().__init__()
        self.eps, self.ca_adaln = norm_eps, cross_attention_adaln
        n_params = 9 if cross_attention_adaln else 6
        kw = dict(norm_eps=norm_eps, rope_type=rope_type, gated=gated)
        if video is not None:
            self.attn1 = Attention(video.dim, None, video.heads, video.d_head, **kw)
            self.attn2 = Attention(video.dim, video.context_dim, video.heads, video.d_head, **kw)
            self.ff = FeedForward(video.dim, video.dim, bias=video.ff_bias)
            self.scale_shift_table = mx.zeros((n_params, video.dim))
            if cross_attention_adaln:
                self.prompt_scale_shift_table = mx.zeros((2, video.dim))
        if audio is not None:
            self.audio_attn1 = Attention(audio.dim, None, audio.heads, audio.d_head, **kw)
            self.audio_attn2 = Attention(audio.dim, audio.context_dim, audio.heads, audio.d_head, **kw)
            self.audio_ff = FeedForward(audio.dim, audio.dim, bias=audio.ff_bias)
            self.audio_scale_shift_table = mx.zeros((n_params, audio.dim))
            if cross_attention_adaln:
                self.audio_prompt_scale_shift_table = mx.zeros((2, audio.dim))
        if video is not None and audio is not None:
            # Both directions use the audio head layout (the reference's choice).
            self.audio_to_video_attn = Attention(video.dim, audio.dim, audio.heads, audio.d_head, **kw)
            self.video_to_audio_attn = Attention(audio.dim, video.dim, audio.heads, audio.d_head, **kw)
            self.scale_shift_table_a2v_ca_audio = mx.zeros((5, audio.dim))
            self.scale_shift_table_a2v_ca_video = mx.zeros((5, video.dim))

    def _self_and_text(self, s: StreamArgs, prefix: str, skip_self: bool = False) -> mx.array:
        """Self-attention then text cross-attention of one modality (prefix "" or "audio_")."""
        return self._text(s, self._self(s, prefix, skip_self), prefix)

    def _self(self, s: StreamArgs, prefix: str, skip_self: bool = False) -> mx.array:
        """The state after self-attention (`skip_self`: STG's value projection in its place)."""
        h, gate = self._self_in(s, prefix)
        return s.x + self[f"{prefix}attn1"](h, pe=s.pe, mask=s.self_mask, skip=skip_self) * gate

    def _self_in(self, s: StreamArgs, prefix: str) -> tuple[mx.array, mx.array]:
        """The self-attention's modulated input and its gate."""
        shift, scale, gate = s.mod.values(self[f"{prefix}scale_shift_table"], 0, 3)
        return _rms(s.x, self.eps) * (1 + scale) + shift, gate

    def _text(self, s: StreamArgs, x: mx.array, prefix: str) -> mx.array:
        """Text cross-attention of one modality on x (the state after self-attention)."""
        k, v = self._text_kv(s, prefix)
        return self._text_with(s, x, prefix, k, v)

    def _text_kv(self, s: StreamArgs, prefix: str) -> tuple[mx.array, mx.array]:
        """The text cross-attention's K/V: of the context modulated by the prompt AdaLN (2.3 / 2.5), else of
        the context. Row-local, so a share of the context rows gives a share of the K/V rows (the
        sequence-parallel forward projects one share per rank and gathers them)."""
        ctx = s.context
        if self.ca_adaln:
            shift_kv, scale_kv = s.prompt_mod.values(self[f"{prefix}prompt_scale_shift_table"], 0, 2)
            ctx = ctx * (1 + scale_kv) + shift_kv
        return self[f"{prefix}attn2"].project_kv(ctx, None)

    def _text_with(self, s: StreamArgs, x: mx.array, prefix: str, k: mx.array, v: mx.array) -> mx.array:
        """Text cross-attention of x's rows over the text K/V `k`, `v` (`_text_kv`)."""
        attn2, h = self[f"{prefix}attn2"], _rms(x, self.eps)
        if not self.ca_adaln:
            return x + attn2.attend(h, attn2.project_q(h, None), k, v, s.context_mask)
        shift_q, scale_q, gate_q = s.mod.values(self[f"{prefix}scale_shift_table"], 6, 9)
        h = h * (1 + scale_q) + shift_q
        return x + attn2.attend(h, attn2.project_q(h, None), k, v, s.context_mask) * gate_q

    def _ff(self, s: StreamArgs, x: mx.array, prefix: str) -> mx.array:
        table, ff = self[f"{prefix}scale_shift_table"], self[f"{prefix}ff"]
        shift, scale, gate = s.mod.values(table, 3, 6)
        return x + ff(_rms(x, self.eps) * (1 + scale) + shift) * gate

    @staticmethod
    def _av_values(table: mx.array, s: StreamArgs, start: int) -> tuple[mx.array, mx.array, mx.array]:
        """(scale, shift, gate) of an AV cross-attention: rows start..start+2 of 4, gate row 4."""
        scale, shift = s.cross_scale_shift.values(table[:4], start, start + 2)
        (gate,) = s.cross_gate.values(table[4:], 0, 1)
        return scale, shift, gate

    def _cross_av(self, v: StreamArgs, a: StreamArgs, vx: mx.array, ax: mx.array,
                  skip: BlockSkip = NO_SKIP) -> tuple[mx.array, mx.array]:
        """a2v then v2a; both read the states normed before either update (v2a sees pre-a2v video).
        A skipped direction leaves its stream as it was."""
        vn, an = _rms(vx, self.eps), _rms(ax, self.eps)
        new_vx = vx if skip.a2v else self._a2v(v, a, vx, vn, an)
        if skip.v2a:
            return new_vx, ax
        query, gate_v2a = self._v2a_query(a, an)
        out = self.video_to_audio_attn(query, context=self._v2a_context(v, vn), pe=a.cross_pe, k_pe=v.cross_pe)
        return new_vx, ax + out * gate_v2a

    def _a2v(self, v: StreamArgs, a: StreamArgs, vx: mx.array, vn: mx.array, an: mx.array) -> mx.array:
        """Audio -> video cross-attention: video rows (any shard of them) over the whole audio."""
        tv, ta = self.scale_shift_table_a2v_ca_video, self.scale_shift_table_a2v_ca_audio
        scale_v, shift_v, gate_a2v = self._av_values(tv, v, 0)
        scale_a, shift_a, _ = self._av_values(ta, a, 0)
        out = self.audio_to_video_attn(vn * (1 + scale_v) + shift_v, context=an * (1 + scale_a) + shift_a,
                                       pe=v.cross_pe, k_pe=a.cross_pe)
        return vx + out * gate_a2v

    def _v2a_query(self, a: StreamArgs, an: mx.array) -> tuple[mx.array, mx.array]:
        """Video -> audio cross-attention: the audio query input and its gate."""
        scale_a, shift_a, gate_v2a = self._av_values(self.scale_shift_table_a2v_ca_audio, a, 2)
        return an * (1 + scale_a) + shift_a, gate_v2a

    def _v2a_context(self, v: StreamArgs, vn: mx.array) -> mx.array:
        """Video -> audio cross-attention: the video context rows (row-local)."""
        scale_v, shift_v, _ = self._av_values(self.scale_shift_table_a2v_ca_video, v, 2)
        return vn * (1 + scale_v) + shift_v

    def __call__(self, video: StreamArgs | None, audio: StreamArgs | None, skip: BlockSkip = NO_SKIP) -> tuple:
        """A frozen stream (its guidance step skipped) passes through unchanged, as upstream's disabled
        modality: its own attentions and FF do not run, but the other stream's cross-attention reads it."""
        has_v = video is not None and video.x.size > 0
        has_a = audio is not None and audio.x.size > 0
        run_v, run_a = has_v and not video.frozen, has_a and not audio.frozen
        vx = self._self_and_text(video, "", skip.video_self) if run_v else (video.x if has_v else None)
        ax = self._self_and_text(audio, "audio_", skip.audio_self) if run_a else (audio.x if has_a else None)
        if has_v and has_a and video.cross_gate is not None and audio.cross_gate is not None:
            vx, ax = self._cross_av(video, audio, vx, ax, replace(skip, a2v=skip.a2v or not run_v,
                                                                   v2a=skip.v2a or not run_a))
        if run_v:
            video = replace(video, x=self._ff(video, vx, ""))
        if run_a:
            audio = replace(audio, x=self._ff(audio, ax, "audio_"))
        return video, audio
