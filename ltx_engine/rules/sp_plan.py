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


@dataclass(frozen=True)
class DitDims:
    """What a forward's gathers depend on: layers, video / audio attention widths, bytes per element."""

    layers: int = 48
    video_width: int = 4096
    audio_width: int = 2048
    itemsize: int = 2
    out_channels: int = 128


FULL_SIZE = DitDims()  # LTX-2 / 2.3, bf16 activations


def forward_bytes(plan: ShardPlan, layers: int, video_width: int, audio_width: int, itemsize: int,
                  out_channels: int, out_itemsize: int = 4) -> int:
    """Bytes ONE rank receives per SP forward (what `Exchange.bytes_received` counts): per layer the
    self-attention K, V (video width) and the video->audio K, V (audio width), then the output rows."""
    dims = DitDims(layers, video_width, audio_width, itemsize, out_channels)
    return sum(site_bytes(plan, dims, out_itemsize).values())


# Shares of a rank's forward computed behind each gather while its bytes move (sequence_parallel.py:
# the audio stream and the video queries behind the self-attention K/V; the video FF and the audio query
# behind the video->audio K/V), measured by `farm bench sp --group socket` on the tiny layout
# (docs/performance.md: the lowest of three runs' medians). Its narrow widths make attention the bulk of
# its forward, so the FF's share there is smaller than at full size: a lower bound on the full-size windows.
OVERLAP_SHARES = {"self": 0.049, "v2a": 0.157}


def site_bytes(plan: ShardPlan, dims: DitDims, out_itemsize: int = 4) -> dict[str, int]:
    """`forward_bytes` by what moves: the self-attention K/V, the video->audio K/V, the output rows."""
    rows = (plan.degree - 1) * plan.per_rank
    return {"self": rows * dims.layers * 2 * dims.video_width * dims.itemsize,
            "v2a": rows * dims.layers * 2 * dims.audio_width * dims.itemsize,
            "output": rows * dims.out_channels * out_itemsize}


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
