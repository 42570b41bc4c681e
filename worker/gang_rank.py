"""One rank of a gang's sequence-parallel stage 1, in its own process (`python -m worker.gang_rank DIR`).

The worker runs its rank here so a collective stuck on a frozen or lost peer can be killed (a ring
blocks forever). DIR holds task.json (params, packs folder, rank, hosts) and inputs.npz; the rank
prints `OPEN` once its group is up, `STEP n` after each step (rank 0 first writes DIR/step<n>.npz, the
states to resume from) and `DONE` after rank 0 wrote DIR/out.npz.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np


def main(folder: Path) -> None:
    task = json.loads((folder / "task.json").read_text())
    rank, params = int(task["rank"]), task["params"]
    (folder / "hosts.json").write_text(json.dumps(task["hosts"]))
    from ltx_engine.parallel.sp_group import open_ring

    group = open_ring(rank, folder / "hosts.json")
    print("OPEN", flush=True)
    from worker.runner import Runner
    from worker.sp_stage import state_arrays

    def on_step(n: int, video, audio) -> None:
        if rank == 0:
            tmp = folder / f"step{n}.tmp.npz"
            np.savez(tmp, **state_arrays(video, audio))
            os.replace(tmp, folder / f"step{n}.npz")
        print(f"STEP {n}", flush=True)

    runner = Runner(
        Path(task["packs_dir"]) if task.get("packs_dir") else None, throttle=task.get("throttle", 1.0)
    )
    runner.sp_group, runner.sp_on_step = group, on_step
    runner.loras.known.update({sha: Path(path) for sha, path in (task.get("loras") or {}).items()})
    with np.load(folder / "inputs.npz") as data:
        inputs = {k: data[k] for k in data.files}
    outputs, metrics = runner.run("denoise_stage1", params, inputs)
    if rank == 0:
        np.savez(folder / "out.tmp.npz", **outputs)
        os.replace(folder / "out.tmp.npz", folder / "out.npz")
        (folder / "metrics.json").write_text(json.dumps(metrics, default=float))
    print("DONE", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
