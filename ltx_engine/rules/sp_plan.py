"""The pure arithmetic of sequence-parallel stage 1: how tokens split over k ranks and what a forward
moves (no model library: the coordinator's planner imports it)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ShardPlan:
    """k equal shards of `tokens` video tokens, padded to a multiple of k (upstream's rule)."""

    tokens: int
    degree: int

    def __post_init__(self) -> None:
        if self.degree < 1 or self.tokens < self.degree:
            raise ValueError(f"cannot split {self.tokens} tokens over {self.degree} ranks")

    @property
    def per_rank(self) -> int:
        return -(-self.tokens // self.degree)

    @property
    def padding(self) -> int:
        return self.per_rank * self.degree - self.tokens

    def indices(self, rank: int) -> np.ndarray:
        """Token indices of a rank's shard; padded rows repeat the last real token."""
        n = self.per_rank
        return np.minimum(np.arange(rank * n, (rank + 1) * n), self.tokens - 1).astype(np.int32)


TEXT_TOKENS = 1024  # rows of the text context every cross-attention reads (the Gemma connector's output)


def splits_text_kv(degree: int, text_tokens: int) -> bool:
    """Whether a k-way forward splits the text cross-attention's K/V (each rank projects 1/k of the context
    rows, the K/V gathered per block like the video's) instead of every rank projecting all of them.

    Yes whenever there are k > 1 ranks and a row for each. The projection is ~1.6 % of a full-size forward
    (48 blocks of 1024 rows through 4096² and 2048² K/V weights: 4.1 TFLOP, 0.83 s/step on an M1 Max), and
    replicated it is a share of every rank that grows with k (6 % at k = 4). Split, it costs
    (k-1)·ceil(1024/k)·48·2·(4096+2048)·2 bytes per rank per step: 0.60 GB at k = 2 to 0.91 GB at k = 4, over
    10 GbE 0.55-0.82 s if waited for, more than the 0.41-0.62 s of compute saved. It is not waited for: the
    text K/V do not depend on the block's input, so their gather moves behind the block's self-attention
    (sequence_parallel.py; 19 MB per block at k = 4, 17 ms on 10 GbE, behind ~55 ms of attention over
    8,160 tokens), which `OVERLAP_SHARES["text"]` counts. Over Thunderbolt 5 it is 0.08-0.11 s either way.
    One rule, no link in it: the ranks run the same graph whatever joins them, and the step model
    (`site_bytes`) reads the same rule."""
    return degree > 1 and text_tokens >= degree


@dataclass(frozen=True)
class DitDims:
    """What a forward's gathers depend on: layers, video / audio attention widths, bytes per element, text rows."""

    layers: int = 48
    video_width: int = 4096
    audio_width: int = 2048
    itemsize: int = 2
    out_channels: int = 128
    text_tokens: int = TEXT_TOKENS

    @classmethod
    def of(cls, transformer: dict, itemsize: int = 2, text_tokens: int = TEXT_TOKENS) -> DitDims:
        """The dims of a pack's DiT from its transformer config (a tiny or bench pack's gathers are
        far smaller than a real pack's, so a model of its gang must not price full size's)."""
        return cls(transformer["num_layers"], transformer["num_attention_heads"] * transformer["attention_head_dim"],
                   transformer["audio_num_attention_heads"] * transformer["audio_attention_head_dim"], itemsize,
                   transformer["out_channels"], text_tokens)

    @property
    def replicated_scale(self) -> float:
        """This DiT's share of a full-size forward's replicated part (every rank runs the audio stream,
        whose linears grow with blocks x audio width²): 1 at full size, ~0 for a bench DiT with a tiny
        audio stream, whose gang therefore splits nearly all of its forward."""
        return self.layers * self.audio_width**2 / (FULL_SIZE.layers * FULL_SIZE.audio_width**2)


FULL_SIZE = DitDims()  # LTX-2 / 2.3, bf16 activations


def forward_bytes(plan: ShardPlan, layers: int, video_width: int, audio_width: int, itemsize: int,
                  out_channels: int, text_tokens: int, out_itemsize: int = 4) -> int:
    """Bytes ONE rank receives per SP forward (what `Exchange.bytes_received` counts): per layer the
    self-attention K, V (video width), the video->audio K, V (audio width) and, when split
    (`splits_text_kv`), the text K, V of both streams; then the output rows."""
    dims = DitDims(layers, video_width, audio_width, itemsize, out_channels, text_tokens)
    return sum(site_bytes(plan, dims, out_itemsize).values())


# Shares of a rank's forward computed behind each gather while its bytes move (sequence_parallel.py:
# the audio stream's self-attention and the video queries behind the self-attention K/V; the video
# self-attention behind the text K/V; the video FF and the audio query behind the video->audio K/V),
# measured by `farm bench sp --group socket` (docs/performance.md). "self" and "v2a": on the tiny layout
# (the lowest of three runs' medians), whose narrow widths make attention the bulk of its forward, so the
# FF's share there is smaller than at full size: a lower bound on the full-size windows. "text": the
# window is the video self-attention, whose share grows with tokens per width, which the tiny layout
# overstates (63 % at 2048 tokens, 64 wide); measured with `--dit bench` (256 wide) at 512 tokens, full
# size's tokens-to-width ratio (8160/4096), the lowest of three runs' medians (14.7-14.9 %; ~24 % by the
# FLOPs of a full-size block at k = 4, so again not above what full size has).
OVERLAP_SHARES = {"self": 0.049, "v2a": 0.157, "text": 0.147}


def site_bytes(plan: ShardPlan, dims: DitDims, out_itemsize: int = 4) -> dict[str, int]:
    """`forward_bytes` by what moves: the self-attention K/V, the video->audio K/V, the text K/V of both
    streams (when `splits_text_kv`), the output rows."""
    rows = (plan.degree - 1) * plan.per_rank
    moved = {"self": rows * dims.layers * 2 * dims.video_width * dims.itemsize,
             "v2a": rows * dims.layers * 2 * dims.audio_width * dims.itemsize,
             "output": rows * dims.out_channels * out_itemsize}
    if splits_text_kv(plan.degree, dims.text_tokens):
        text_rows = (plan.degree - 1) * ShardPlan(dims.text_tokens, plan.degree).per_rank
        moved["text"] = text_rows * dims.layers * 2 * (dims.video_width + dims.audio_width) * dims.itemsize
    return moved


def exposed_wire_s(plan: ShardPlan, compute_s: float, link_bytes_per_s: float, dims: DitDims = FULL_SIZE) -> float:
    """Seconds of a forward's gathers a rank waits for: each gather's bytes over the link, less the compute
    behind it (`OVERLAP_SHARES` of the rank's `compute_s`; the output rows have none). Per block the same
    bytes and windows, so the per-block minimum summed is the forward's minimum."""
    moved = site_bytes(plan, dims)
    return sum(max(0.0, n / link_bytes_per_s - OVERLAP_SHARES.get(site, 0.0) * compute_s) for site, n in moved.items())


def step_seconds(degree: int, tokens: int, split_s: float, replicated_s: float, link_bytes_per_s: float,
                 dims: DitDims = FULL_SIZE) -> float:
    """Modelled seconds of one step on `degree` ranks: the replicated part (audio, AdaLN), the split
    part over the ranks, and the gathers' wire time not hidden behind compute (`exposed_wire_s`)."""
    if degree == 1:
        return replicated_s + split_s
    compute = replicated_s + split_s / degree
    return compute + exposed_wire_s(ShardPlan(tokens, degree), compute, link_bytes_per_s, dims)
