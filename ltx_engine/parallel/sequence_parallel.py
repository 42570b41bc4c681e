"""Sequence-parallel DiT forward: the video tokens split over k ranks, audio replicated.

The split is upstream's (`ltx_core.multigpu.transformer.sequence_parallel`, not in ltx-core 1.0.0;
read from Lightricks/LTX-2): pad the video tokens to the next multiple of k, equal shards, rank r holds
tokens [r*n, (r+1)*n). Upstream pads with zeros and masks the padded keys; here a padded row is a copy
of the last real token and the padded keys are dropped after the gather, so no padded row ever reaches
a real token and no attention changes shape against the unsplit forward.

Per block (see docs/ARCHITECTURE.md, "Sequence-parallel stage 1"):
- video self-attention: each rank projects K/V of its rows; K and V are all-gathered (rank order),
  cut to the real tokens; each rank attends its own queries over them;
- text cross-attention (both streams): its queries are row-local; its K/V, of the text context (modulated
  by sigma on 2.3 / 2.5, so new every step), are split like the video's when `splits_text_kv` says so:
  each rank projects its share of the context rows (padded the same way), the shares are gathered;
- FF, AdaLN: row-local, no exchange;
- audio -> video: video queries of the shard over the whole (replicated) audio, no exchange;
- video -> audio: K/V of the video rows gathered like self-attention; every rank computes the whole
  (small) audio stream, so every rank holds the same audio state;
- the output's video rows are gathered once at the end, so every rank returns the whole velocity.

A guidance pass's perturbation (`sp_forward`'s `perturbation`) skips the same per block on every rank, as
the unsplit block does: an STG-skipped self-attention is its value projection (row-local, no gather), a
skipped v2a drops its gather, a frozen audio stream runs nothing of its own (a2v still reads it).

An `Exchange` decides where the shards live: `GroupExchange` (one shard per process, over an
`mx.distributed` group or plain sockets, sp_socket.py) or `LocalExchange` (all k shards in one process, concatenation in place of
the gather). Both run the same per-shard code on the same shapes, so they agree bit for bit.

The schedule hides the exchange behind compute where the bytes move on threads (the socket group): a
gather is started as soon as its K/V are evaluated, then the block's work that does not need the
others' rows is evaluated while they move (the audio stream's self-attention and the video queries
behind the self-attention K/V; the video self-attention behind the text K/V, which need nothing of the
block's input; the video FF and the audio query behind the video->audio K/V),
then the gather is waited for. Only WHEN arrays are evaluated changes, never which ops run on what, so
the bits are those of the lazy one-graph forward (LocalExchange and the ring keep that graph: their
`start_gather` is the lazy gather and `meanwhile` does nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import mlx.core as mx
import numpy as np

from ltx_engine.models.dit_blocks import (
    NO_SKIP,
    BasicAVTransformerBlock,
    BlockSkip,
    Modulation,
    StreamArgs,
    _rms,
)
from ltx_engine.models.rope import SPLIT, RopeTable
from ltx_engine.rules.sp_plan import ShardPlan, forward_bytes, splits_text_kv

__all__ = ["Exchange", "GroupExchange", "LocalExchange", "ShardPlan", "forward_bytes", "shard_stream", "sp_block",
           "sp_forward"]


@dataclass
class Exchange:
    """Where the shards of one forward live, and how rows are gathered across them.

    `bytes_received` counts what ONE rank receives per gather ((k-1) shards of each gathered array),
    the same figure for both kinds, so a one-process run measures a k-process run's traffic."""

    plan: ShardPlan
    ranks: tuple[int, ...]
    bytes_received: int = 0
    gathers: int = 0
    log: list[tuple[str, int]] = field(default_factory=list)

    def gather(self, parts: list[mx.array], axis: int, what: str) -> mx.array:
        """The rows of every rank in rank order along `axis`, cut to the real tokens."""
        return self.start_gather(parts, axis, what)()

    def start_gather(self, parts: list[mx.array], axis: int, what: str,
                     plan: ShardPlan | None = None) -> Callable[[], mx.array]:
        """Start `gather`; the returned call waits for the rows (every rank starts its gathers in one order).
        `plan`: how the gathered rows were split when they are not the video tokens (the text context's)."""
        plan = self.plan if plan is None else plan
        got = (plan.degree - 1) * parts[0].nbytes
        self.bytes_received += got
        self.gathers += 1
        self.log.append((what, got))
        wait = self._start(parts, axis)
        if not plan.padding:
            return wait
        return lambda: mx.take(wait(), mx.arange(plan.tokens), axis=axis)

    def meanwhile(self, *work: mx.array | None) -> None:
        """Evaluate `work` now if gathers move on threads (it is then computed while they do); else
        leave the graph lazy, as one forward's graph."""

    def _start(self, parts: list[mx.array], axis: int) -> Callable[[], mx.array]:
        raise NotImplementedError


class LocalExchange(Exchange):
    """All k shards in this process (`farm render --local` of a k-way plan)."""

    def __init__(self, plan: ShardPlan):
        super().__init__(plan, tuple(range(plan.degree)))

    def _start(self, parts: list[mx.array], axis: int) -> Callable[[], mx.array]:
        full = mx.concatenate(parts, axis=axis)
        return lambda: full


class GroupExchange(Exchange):
    """This process's shard, the others' over a group: an `mx.distributed` one (ring, JACCL, MPI), or a
    `SocketGroup` (sp_socket.py: what a farm worker joins per gang, in its own process)."""

    def __init__(self, plan: ShardPlan, group):
        if group.size() != plan.degree:
            raise ValueError(f"group of {group.size()} ranks for a {plan.degree}-way plan")
        super().__init__(plan, (group.rank(),))
        self.group = group

    def _start(self, parts: list[mx.array], axis: int) -> Callable[[], mx.array]:
        (part,) = parts
        moved = mx.moveaxis(part, axis, 0)
        if isinstance(self.group, mx.distributed.Group):
            gathered = mx.moveaxis(mx.distributed.all_gather(moved, group=self.group), 0, axis)
            return lambda: gathered
        gathering = self.group.start_gather(moved)
        return lambda: mx.moveaxis(gathering.wait(), 0, axis)

    def meanwhile(self, *work: mx.array | None) -> None:
        if not isinstance(self.group, mx.distributed.Group):
            mx.eval(*[w for w in work if w is not None])


def _take(a: mx.array | None, idx: mx.array, axis: int) -> mx.array | None:
    return None if a is None else mx.take(a, idx, axis=axis)


def _shard_rope(pe: RopeTable | None, idx: mx.array) -> RopeTable | None:
    if pe is None:
        return None
    axis = 2 if pe.kind == SPLIT else 1  # SPLIT (B, H, T, Dh/2); INTERLEAVED (B, T, inner)
    return RopeTable(_take(pe.cos, idx, axis), _take(pe.sin, idx, axis), pe.kind)


def _shard_modulation(m: Modulation | None, idx: np.ndarray) -> Modulation | None:
    """The rows of a shard's tokens; per-sample modulations (one token) are shared."""
    if m is None or m.tokens == 1:
        return m
    n = len(idx)
    if m.inverse is not None:
        inverse = m.inverse.reshape(m.batch, m.tokens)[:, mx.array(idx)].reshape(-1)
        return Modulation(m.rows, inverse, m.batch, n, m.num_params)
    rows = m.rows.reshape(m.batch, m.tokens, -1)[:, mx.array(idx)].reshape(m.batch * n, -1)
    return Modulation(rows, None, m.batch, n, m.num_params)


def shard_stream(s: StreamArgs, idx: np.ndarray) -> StreamArgs:
    """One rank's share of the prepared video stream (text context and per-sample tables shared)."""
    i = mx.array(idx)
    return replace(
        s, x=_take(s.x, i, 1), embedded_timestep=_take(s.embedded_timestep, i, 1),
        mod=_shard_modulation(s.mod, idx), pe=_shard_rope(s.pe, i), self_mask=_take(s.self_mask, i, 2),
        cross_pe=_shard_rope(s.cross_pe, i), cross_scale_shift=_shard_modulation(s.cross_scale_shift, idx),
        context_mask=_shard_rows(s.context_mask, i),
    )


def _shard_rows(mask: mx.array | None, idx: mx.array) -> mx.array | None:
    """A text mask's rows of the shard's tokens (Prompt Relay's bias has one per token; a mask of one row is
    shared)."""
    return mask if mask is None or mask.ndim < 4 or mask.shape[2] == 1 else mx.take(mask, idx, axis=2)


def _gather_kv(ex: Exchange, kv: list[tuple[mx.array, mx.array]], what: str,
               meanwhile: list[mx.array | None]) -> tuple[mx.array, mx.array]:
    """K and V of every rank (token axis 2), `meanwhile` (work that needs neither) computed while they move."""
    k = ex.start_gather([k for k, _ in kv], 2, f"{what}_k")
    v = ex.start_gather([v for _, v in kv], 2, f"{what}_v")
    ex.meanwhile(*meanwhile)
    return k(), v()


def _start_text_kv(block: BasicAVTransformerBlock, s: StreamArgs, prefix: str,
                   ex: Exchange) -> Callable[[], tuple[mx.array, mx.array]]:
    """Start the text K/V of one stream (`BasicAVTransformerBlock._text_kv`); the returned call waits for
    them. Split (`splits_text_kv`): each rank projects its share of the context rows and the shares are
    gathered like the video K/V; else every rank projects all of them."""
    rows = s.context.shape[1]
    if not splits_text_kv(ex.plan.degree, rows):
        kv = block._text_kv(s, prefix)
        return lambda: kv
    plan = ShardPlan(rows, ex.plan.degree)
    kv = [block._text_kv(_shard_context(s, plan.indices(r)), prefix) for r in ex.ranks]
    k = ex.start_gather([k for k, _ in kv], 2, f"{prefix}text_k", plan)
    v = ex.start_gather([v for _, v in kv], 2, f"{prefix}text_v", plan)
    return lambda: (k(), v())


def _shard_context(s: StreamArgs, idx: np.ndarray) -> StreamArgs:
    """A stream with a share of its text context's rows (the prompt modulation's too, if it has a row each)."""
    return replace(s, context=mx.take(s.context, mx.array(idx), axis=1),
                   prompt_mod=_shard_modulation(s.prompt_mod, idx))


def _self_attention(block: BasicAVTransformerBlock, shards: list[StreamArgs], audio: StreamArgs | None,
                    ex: Exchange, skip: BlockSkip = NO_SKIP) -> tuple[list[mx.array], mx.array | None]:
    """Video self- and text attention of the shards, and the audio stream's (when it runs): the audio
    self-attention behind the video K/V gather, the video self-attention behind the text K/V gathers. An
    STG-skipped video self-attention is its value projection, row-local: no gather."""
    ax = block._self(audio, "audio_", skip.audio_self) if audio is not None else None
    if skip.video_self:
        vx = [block._self(s, "", True) for s in shards]
    else:
        attn = block.attn1
        inputs = [block._self_in(s, "") for s in shards]
        kv = [attn.project_kv(h, s.pe) for (h, _), s in zip(inputs, shards, strict=True)]
        q = [attn.project_q(h, s.pe) for (h, _), s in zip(inputs, shards, strict=True)]
        k, v = _gather_kv(ex, kv, "self", [*q, ax])
        vx = [s.x + attn.attend(h, qs, k, v, s.self_mask) * gate
              for (h, gate), qs, s in zip(inputs, q, shards, strict=True)]
    text = _start_text_kv(block, shards[0], "", ex)
    audio_text = _start_text_kv(block, audio, "audio_", ex) if audio is not None else None
    ex.meanwhile(*vx, ax)
    k, v = text()
    vx = [block._text_with(s, x, "", k, v) for s, x in zip(shards, vx, strict=True)]
    return vx, None if audio_text is None else block._text_with(audio, ax, "audio_", *audio_text())


def _cross_av_ff(block: BasicAVTransformerBlock, shards: list[StreamArgs], audio: StreamArgs,
                 vx: list[mx.array], ax: mx.array, ex: Exchange, skip: BlockSkip = NO_SKIP,
                 ) -> tuple[list[mx.array], mx.array]:
    """a2v, v2a, then the video FF (behind the video->audio gather); the audio state before its FF. A
    skipped direction (modality isolation, a frozen audio stream's v2a) leaves its stream as it was."""
    vn = [_rms(x, block.eps) for x in vx]
    an = _rms(ax, block.eps)
    new_vx = vx if skip.a2v else [block._a2v(s, audio, x, n, an) for s, x, n in zip(shards, vx, vn, strict=True)]
    ff = [block._ff(s, x, "") for s, x in zip(shards, new_vx, strict=True)]
    if skip.v2a:
        return ff, ax
    attn = block.video_to_audio_attn
    kv = [attn.project_kv(block._v2a_context(s, n), s.cross_pe) for s, n in zip(shards, vn, strict=True)]
    query, gate = block._v2a_query(audio, an)
    q = attn.project_q(query, audio.cross_pe)
    k, v = _gather_kv(ex, kv, "v2a", [*ff, q])
    return ff, ax + attn.attend(query, q, k, v, None) * gate


def sp_block(block: BasicAVTransformerBlock, shards: list[StreamArgs], audio: StreamArgs | None,
             ex: Exchange, skip: BlockSkip = NO_SKIP) -> tuple[list[StreamArgs], StreamArgs | None]:
    """One joint block on this process's video shards and the replicated audio stream; `skip` a guidance
    pass's perturbation of this block, as `BasicAVTransformerBlock.__call__` reads it. A frozen audio
    stream (its guider skips the step) runs nothing of its own; the video's a2v still reads it."""
    has_a = audio is not None and audio.x.size > 0
    run_a = has_a and not audio.frozen
    vx, ax = _self_attention(block, shards, audio if run_a else None, ex, skip)
    if not run_a and has_a:
        ax = audio.x
    if has_a and shards[0].cross_gate is not None and audio.cross_gate is not None:
        vx, ax = _cross_av_ff(block, shards, audio, vx, ax, ex, replace(skip, v2a=skip.v2a or not run_a))
    else:
        vx = [block._ff(s, x, "") for s, x in zip(shards, vx, strict=True)]
    shards = [replace(s, x=x) for s, x in zip(shards, vx, strict=True)]
    if run_a:
        audio = replace(audio, x=block._ff(audio, ax, "audio_"))
    return shards, audio


def sp_forward(model, video, audio, ex: Exchange, perturbation=None) -> tuple[mx.array, mx.array | None]:
    """`model(video, audio, perturbation)` with the video tokens split as `ex.plan` says; every rank returns
    the whole video velocity and the whole audio velocity (None when the audio is disabled), see the module
    docstring. `perturbation`: a guidance pass's (STG, modality isolation), every rank skipping the same."""
    if video is None or not video.enabled:
        raise ValueError("sequence parallel splits the video stream; this forward has none")
    if video.latent.shape[1] != ex.plan.tokens:
        raise ValueError(f"{video.latent.shape[1]} video tokens for a plan of {ex.plan.tokens}")
    skips = model.block_skips(perturbation)
    v = model._prepare(video, audio, "")
    a = None if audio is None else replace(model._prepare(audio, video, "audio_"), frozen=not audio.enabled)
    shards = [shard_stream(v, ex.plan.indices(r)) for r in ex.ranks]
    bound = getattr(model, "bound_blocks", None)  # a streamed DiT binds each block when reached (loading/streaming.py)
    for block, skip in zip(bound() if bound else model.transformer_blocks, skips, strict=True):
        shards, a = sp_block(block, shards, a, ex, skip)
        if bound:  # this block's outputs now, before the next one binds
            mx.eval([s.x for s in shards] + ([a.x] if a is not None else []))
    vx = ex.gather([model._output("", s) for s in shards], 1, "output").astype(video.latent.dtype)
    ax = model._output("audio_", a).astype(audio.latent.dtype) if a is not None and not a.frozen else None
    return vx, ax
