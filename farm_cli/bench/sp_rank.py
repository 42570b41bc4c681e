"""One process of `farm bench sp`: `python -m farm_cli.bench.sp_rank MODE F H W REPEATS OUT [RANK HOSTFILE]`.

MODE `one`: the unsplit forward (one worker); `sp`: this rank of a group's SP forward (mx.distributed's
ring, or with SP_BACKEND=socket the `SocketGroup` a gang's worker joins). Each
process is pinned to one core (one core stands for one Mac), builds the tiny pack's DiT layout from
seed 0, runs one warm-up forward (and, for `sp`, opens the group), then REPEATS timed forwards, and
for `sp` the forward's gathers alone (the wire time on this link). Writes OUT (JSON)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import mlx.core as mx
import numpy as np

from ltx_engine.models import patchify as P
from ltx_engine.models.transformer import LTXModel, Modality, TransformerConfig, tiny_config

AUDIO_TOKENS = 126  # ~5 s of audio latents
OPEN_S = 900.0


def _inputs(f: int, h: int, w: int) -> tuple[Modality, Modality]:
    cfg, rng = tiny_config(), np.random.default_rng(1)
    tv = f * h * w
    video = Modality(latent=mx.array(rng.standard_normal((1, tv, 128), np.float32)), sigma=mx.array([0.9]),
                     timesteps=mx.full((1, tv), 0.9), positions=P.video_positions(1, f, h, w, 24.0),
                     context=mx.array(rng.standard_normal((1, 64, cfg["cross_attention_dim"]), np.float32)))
    audio = Modality(latent=mx.array(rng.standard_normal((1, AUDIO_TOKENS, 128), np.float32)),
                     sigma=mx.array([0.9]), timesteps=mx.full((1, AUDIO_TOKENS), 0.9),
                     positions=P.audio_positions(1, AUDIO_TOKENS),
                     context=mx.array(rng.standard_normal((1, 64, cfg["audio_cross_attention_dim"]), np.float32)))
    return video, audio


def _timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval(*[o for o in fn() if o is not None])
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _wire_s(log: list[tuple[str, int]], group, repeats: int) -> float:
    """Seconds of one forward's gathers alone: zeros of each gathered shard's size, all-gathered."""
    peers = group.size() - 1
    parts = [mx.zeros((n // (4 * peers),), mx.float32) for _, n in log]
    mx.eval(parts)
    if isinstance(group, mx.distributed.Group):
        return _timed(lambda: [mx.distributed.all_gather(p, group=group) for p in parts], repeats)
    return _timed(lambda: [group.all_gather(p) for p in parts], repeats)


def _group(rank: int, hostfile: str):
    if os.environ.get("SP_BACKEND") != "socket":
        from ltx_engine.parallel.sp_group import open_ring

        return open_ring(rank, hostfile)
    from ltx_engine.parallel.sp_socket import SocketGroup

    group = SocketGroup.open(rank, json.loads(open(hostfile).read()), OPEN_S)
    group.arm(OPEN_S)  # a bench: no peer is expected to freeze
    return group


def main(argv: list[str]) -> None:
    mode, f, h, w, repeats, out, *ring = argv
    rank = int(ring[0]) if ring else 0
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    mx.random.seed(0)
    model = LTXModel(TransformerConfig.from_config({"transformer": tiny_config()}))
    mx.eval(model.parameters())
    video, audio = _inputs(int(f), int(h), int(w))
    result: dict = {"tokens": video.latent.shape[1]}
    if mode == "one":
        _timed(lambda: model(video, audio), 1)
        result["forward_s"] = _timed(lambda: model(video, audio), int(repeats))
    else:
        from ltx_engine.parallel.sequence_parallel import GroupExchange, ShardPlan, sp_forward

        group = _group(rank, ring[1])
        ex = GroupExchange(ShardPlan(video.latent.shape[1], group.size()), group)
        _timed(lambda: sp_forward(model, video, audio, ex), 1)
        result["bytes_per_forward"], log = ex.bytes_received, list(ex.log)
        result["forward_s"] = _timed(lambda: sp_forward(model, video, audio, ex), int(repeats))
        result["wire_s"] = _wire_s(log, group, 3)
    with open(out if rank == 0 else f"{out}.{rank}", "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
