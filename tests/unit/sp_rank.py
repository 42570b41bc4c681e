"""One rank of a sequence-parallel test ring: `python -m tests.unit.sp_rank MODE OUT F H W RANK HOSTFILE`.

MODE `forward`: the tiny DiT's SP forward on a (F, H, W) video grid; `denoise`: stage 1 (4 steps) of
`sp_model.stage1_inputs()` keeping the latent after every step. Writes OUT/rankR.npz. `freeze` / `fail`:
the forward, with rank 1 SIGSTOPping itself / exiting 3 once the group is open (rank 0 then blocks in
the first gather)."""

from __future__ import annotations

import os
import signal
import sys

import mlx.core as mx
import numpy as np

from ltx_engine.parallel.sequence_parallel import GroupExchange, ShardPlan, sp_forward
from ltx_engine.parallel.sp_denoise import denoise_stage1
from ltx_engine.parallel.sp_group import open_ring
from tests.unit import sp_model


def main(argv: list[str]) -> None:
    mode, out, f, h, w, rank, hostfile = argv
    group = open_ring(int(rank), hostfile)
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
