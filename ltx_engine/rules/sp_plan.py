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
    per_row = layers * (2 * video_width + 2 * audio_width) * itemsize + out_channels * out_itemsize
    return (plan.degree - 1) * plan.per_rank * per_row


def step_seconds(degree: int, tokens: int, split_s: float, replicated_s: float, link_bytes_per_s: float,
                 dims: DitDims = FULL_SIZE) -> float:
    """Modelled seconds of one step on `degree` ranks: the replicated part (audio, AdaLN), the split
    part over the ranks, and the gathers over the link (no overlap of wire and compute)."""
    if degree == 1:
        return replicated_s + split_s
    moved = forward_bytes(ShardPlan(tokens, degree), dims.layers, dims.video_width, dims.audio_width,
                          dims.itemsize, dims.out_channels)
    return replicated_s + split_s / degree + moved / link_bytes_per_s
