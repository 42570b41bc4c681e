"""One rank of a sequence-parallel test ring: `python -m tests.unit.sp_rank MODE OUT F H W RANK HOSTFILE`.

MODE `forward`: the tiny DiT's SP forward on a (F, H, W) video grid; `denoise`: stage 1 (4 steps) of
`sp_model.stage1_inputs()` keeping the latent after every step. Writes OUT/rankR.npz. `freeze` / `fail`:
the forward, with rank 1 SIGSTOPping itself / exiting 3 once the group is open (rank 0 then blocks in
the first gather of a ring; a socket group raises `PeerLost` at its deadline, and rank 0 exits 4).
The group is mx.distributed's ring, or with SP_BACKEND=socket the in-process `SocketGroup`."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

from ltx_engine.parallel.sequence_parallel import GroupExchange, ShardPlan, sp_forward
from ltx_engine.parallel.sp_denoise import denoise_stage1
from ltx_engine.parallel.sp_group import open_ring
from ltx_engine.parallel.sp_socket import PeerLost, SocketGroup
from tests.unit import sp_model

SOCKET_DEADLINE_S = 3.0  # a frozen peer: rank 0's gather gives up after this


def _group(rank: int, hostfile: str, broken: bool):
    if os.environ.get("SP_BACKEND") != "socket":
        return open_ring(rank, hostfile)
    group = SocketGroup.open(rank, json.loads(Path(hostfile).read_text()), 60)
    group.arm(SOCKET_DEADLINE_S if broken else 60)
    return group


def main(argv: list[str]) -> None:
    try:
        run(argv)
    except PeerLost as exc:
        print(f"PeerLost: {exc}", flush=True)
        sys.exit(4)


def run(argv: list[str]) -> None:
    mode, out, f, h, w, rank, hostfile = argv
    group = _group(int(rank), hostfile, mode in ("freeze", "fail"))
    if mode in ("freeze", "fail") and rank == "1":  # the peer dies or freezes before the forward
        if mode == "fail":
            sys.exit(3)
        os.kill(os.getpid(), signal.SIGSTOP)
    model = sp_model.seeded_model()
    if mode in ("forward", "freeze", "fail"):
        video, audio = sp_model.forward_inputs((int(f), int(h), int(w)))
        ex = GroupExchange(ShardPlan(video.latent.shape[1], group.size()), group)
        v, a = sp_forward(model, video, audio, ex)
        mx.eval(v, a)
        np.savez(f"{out}/rank{rank}.npz", video=np.array(v), audio=np.array(a), bytes=ex.bytes_received)
        return
    inputs = sp_model.stage1_inputs()
    ex = GroupExchange(ShardPlan(inputs.video_tokens, group.size()), group)
    kept: dict[str, np.ndarray] = {}

    def keep(step, video, audio):
        kept[f"video{step}"], kept[f"audio{step}"] = video.latent, audio.latent

    result = denoise_stage1(model, inputs, 128, ex, on_step=keep)
    np.savez(f"{out}/rank{rank}.npz", **kept, **result, bytes=ex.bytes_received)


if __name__ == "__main__":
    main(sys.argv[1:])
