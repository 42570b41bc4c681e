"""One process of `farm bench sp`: `python -m farm_cli.bench.sp_rank MODE DIT F H W REPEATS OUT [RANK HOSTFILE]`.

MODE `one`: the unsplit forward (one worker); `sp`: this rank of a group's SP forward (mx.distributed's
ring, or with SP_BACKEND=socket the `SocketGroup` a gang's worker joins). Each
process is pinned to one core (one core stands for one Mac), builds the tiny pack's DiT layout (DIT: the
`tiny` or `bench` size of `farm pack tiny --dit`, with that pack's text context rows) from seed 0, runs one warm-up forward (and, for `sp`, opens the group), then REPEATS timed forwards, and
for `sp` the forward's gathers alone (the wire time on this link). Over the socket group `sp` times two
schedules, alternating forward by forward: the product's (each gather's bytes moving while the block's
work that does not need them is computed) and the serial one before it (each gather waited for where it
starts), with the seconds blocked in gathers for each, and checks both give the same bits. Writes OUT
(JSON)."""

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
from ltx_engine.parallel.sequence_parallel import GroupExchange, ShardPlan, sp_forward
from ltx_engine.rules.sp_plan import TEXT_TOKENS
from ltx_engine.tiny.tiny_pack import DIT_SIZES

AUDIO_TOKENS = 126  # ~5 s of audio latents
OPEN_S = 900.0
TEXT_ROWS = {"tiny": 64, "bench": TEXT_TOKENS}  # the bench pack's contexts are its tokenizer's 1024 rows


def dit_config(dit: str) -> dict:
    """The transformer section of `farm pack tiny --dit DIT`'s DiT: its size, the text context at its width."""
    cfg = tiny_config() | DIT_SIZES[dit]
    if dit != "tiny":
        cfg["cross_attention_dim"] = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    return cfg


def _inputs(dit: str, f: int, h: int, w: int) -> tuple[Modality, Modality]:
    cfg, rng, rows = dit_config(dit), np.random.default_rng(1), TEXT_ROWS[dit]
    tv = f * h * w
    video = Modality(latent=mx.array(rng.standard_normal((1, tv, 128), np.float32)), sigma=mx.array([0.9]),
                     timesteps=mx.full((1, tv), 0.9), positions=P.video_positions(1, f, h, w, 24.0),
                     context=mx.array(rng.standard_normal((1, rows, cfg["cross_attention_dim"]), np.float32)))
    audio = Modality(latent=mx.array(rng.standard_normal((1, AUDIO_TOKENS, 128), np.float32)),
                     sigma=mx.array([0.9]), timesteps=mx.full((1, AUDIO_TOKENS), 0.9),
                     positions=P.audio_positions(1, AUDIO_TOKENS),
                     context=mx.array(rng.standard_normal((1, rows, cfg["audio_cross_attention_dim"]), np.float32)))
    return video, audio


def _timed(fn, repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds (this process, all its threads) of `fn`: on a loaded machine the CPU
    seconds are what the forward costs, the wall also what the other processes took."""
    times = []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        mx.eval(*[o for o in fn() if o is not None])
        times.append((time.perf_counter() - t, time.process_time() - c))
    return statistics.median(w for w, _ in times), statistics.median(c for _, c in times)


def _wire_s(log: list[tuple[str, int]], group, repeats: int) -> float:
    """Seconds of one forward's gathers alone: zeros of each gathered shard's size, all-gathered."""
    peers = group.size() - 1
    parts = [mx.zeros((n // (4 * peers),), mx.float32) for _, n in log]
    mx.eval(parts)
    if isinstance(group, mx.distributed.Group):
        return _timed(lambda: [mx.distributed.all_gather(p, group=group) for p in parts], repeats)[0]
    return _timed(lambda: [group.all_gather(p) for p in parts], repeats)[0]


def _group(rank: int, hostfile: str):
    if os.environ.get("SP_BACKEND") != "socket":
        from ltx_engine.parallel.sp_group import open_ring

        return open_ring(rank, hostfile)
    from ltx_engine.parallel.sp_socket import SocketGroup

    group = SocketGroup.open(rank, json.loads(open(hostfile).read()), OPEN_S)
    group.arm(OPEN_S)  # a bench: no peer is expected to freeze
    return group


class SerialExchange(GroupExchange):
    """The schedule before the overlap: each gather waited for where it starts, nothing evaluated meanwhile
    (the graph stays lazy between gathers), the baseline the overlap is measured against."""

    def _start(self, parts: list[mx.array], axis: int):
        full = super()._start(parts, axis)()
        return lambda: full

    def meanwhile(self, *work: mx.array | None) -> None:
        pass


def _site(what: str) -> str:
    """The step model's site of a gather (`sp_plan.site_bytes`): "self", "text" (both streams'), "v2a", "output"."""
    return what.rsplit("_", 1)[0].removeprefix("audio_")


class TimedExchange(GroupExchange):
    """The product's schedule, timing its windows: the seconds of the work evaluated behind each gather,
    by what the gather moves (self-attention, text or video->audio attention K/V)."""

    windows: dict[str, float]

    def meanwhile(self, *work: mx.array | None) -> None:
        t = time.perf_counter()
        super().meanwhile(*work)
        site = _site(self.log[-1][0])
        self.windows[site] = self.windows.get(site, 0.0) + time.perf_counter() - t


def _schedules(model, video, audio, group, repeats: int) -> dict:
    """Both schedules alternating (serial first in odd rounds, overlapped first in even ones): the median
    forward and blocked-in-gathers seconds of each, and whether their outputs have the same bits."""
    plan = ShardPlan(video.latent.shape[1], group.size())
    runs = {"serial": SerialExchange(plan, group), "overlap": TimedExchange(plan, group)}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    outs, windows = {}, []
    for i in range(repeats + 1):  # round 0 warms both
        for name in (("serial", "overlap") if i % 2 else ("overlap", "serial")):
            waited, t, c = group.wait_s, time.perf_counter(), time.process_time()
            runs["overlap"].windows = {}
            outs[name] = [o for o in sp_forward(model, video, audio, runs[name]) if o is not None]
            mx.eval(*outs[name])
            if i:
                times[name].append((time.perf_counter() - t, group.wait_s - waited, time.process_time() - c))
                windows += [runs["overlap"].windows] if name == "overlap" else []
    same = all(np.array_equal(np.array(a), np.array(b)) for a, b in zip(outs["serial"], outs["overlap"], strict=True))
    got = {f"{name}_{what}": statistics.median(t[j] for t in times[name])
           for name in times for j, what in enumerate(("forward_s", "wait_s", "cpu_s"))}
    window = {site: statistics.median(w[site] for w in windows) for site in windows[0]}
    wire = {}
    for what, n in runs["overlap"].log[-len(runs["overlap"].log) // (repeats + 1):]:
        wire[_site(what)] = wire.get(_site(what), 0) + n
    return {**got, "same_bits": same, "window_s": window, "site_bytes": wire}


def main(argv: list[str]) -> None:
    mode, dit, f, h, w, repeats, out, *ring = argv
    rank = int(ring[0]) if ring else 0
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    mx.random.seed(0)
    model = LTXModel(TransformerConfig.from_config({"transformer": dit_config(dit)}))
    mx.eval(model.parameters())
    video, audio = _inputs(dit, int(f), int(h), int(w))
    result: dict = {"tokens": video.latent.shape[1]}
    if mode == "one":
        _timed(lambda: model(video, audio), 1)
        result["forward_s"], result["cpu_s"] = _timed(lambda: model(video, audio), int(repeats))
    else:
        group = _group(rank, ring[1])
        ex = GroupExchange(ShardPlan(video.latent.shape[1], group.size()), group)
        _timed(lambda: sp_forward(model, video, audio, ex), 1)
        result["bytes_per_forward"], log = ex.bytes_received, list(ex.log)
        if isinstance(group, mx.distributed.Group):
            result["forward_s"], result["cpu_s"] = _timed(lambda: sp_forward(model, video, audio, ex), int(repeats))
        else:
            result.update(_schedules(model, video, audio, group, int(repeats)))
            result["forward_s"], result["cpu_s"] = result["overlap_forward_s"], result["overlap_cpu_s"]
        result["wire_s"] = _wire_s(log, group, 3)
    with open(out if rank == 0 else f"{out}.{rank}", "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
