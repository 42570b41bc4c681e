"""A gang member's part of a sequence-parallel stage 1, in the worker's own process.

The lease reply carries the handout (`params.gang`: rank, degree, host:port per rank, deadlines; see
coordinator/state/lua/gang.lua). The rank runs on the runner's already-loaded DiT (one model per Mac),
its shards exchanged over a `SocketGroup` (ltx_engine/parallel/sp_socket.py says why not
`mx.distributed`): the group must open within `open_deadline_s` and each step must finish within
`step_deadline_s` (the cost model's step × a margin, with a floor), both as socket deadlines; a peer
frozen, killed or unreachable ends in `PeerLost`, never in a wait. Rank 0 holds the lease: it uploads
the states after each step as blobs and reports them in its heartbeat (the coordinator keeps them on
the task, so a re-lease resumes there), and when the gang breaks it closes its sockets (its peers'
gathers end at once), says so (the members' heartbeats then go stale) and finishes stage 1 alone
from the last kept step, which is bit-identical (sequence parallel is exact here). A rank > 0 reports
nothing: its part just ends.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from ltx_engine.parallel.sp_socket import PeerLost, SocketGroup
from protos.records import Progress
from protos.tensors import encode_tensor
from worker.sp_stage import state_arrays

log = logging.getLogger("farm.worker")
HOST_ENV = "FARM_SP_HOST"  # the address this Mac's rank listens on (its Thunderbolt / Ethernet address)


def capabilities() -> dict:
    """What the worker adds to its registration: the host its rank listens on, when set."""
    host = os.environ.get(HOST_ENV, "").strip()
    return {"sp_host": host} if host else {}


def is_gang(params: dict) -> bool:
    return isinstance(params.get("gang"), dict)


class GangBroke(Exception):
    """The group did not open, a peer was lost, or a step passed its deadline: a peer's trouble, not
    the task's (worker/faults.py reads `transient`)."""

    transient = True


@contextmanager
def rank_of(runner, group, on_step) -> Iterator[None]:
    """Stage 1 run inside the block is this process's rank of `group`, on the runner's loaded model."""
    runner.sp_group, runner.sp_on_step = group, on_step
    try:
        yield
    finally:
        runner.sp_group = runner.sp_on_step = None


class StepKeeper(threading.Thread):
    """Rank 0's kept steps, uploaded beside the steps (an upload that waits for a restarting
    coordinator must not hold the gang's deadlines up): the latest step wins, and once stopped nothing more
    is reported (the gang's end is)."""

    def __init__(self, agent, task_id: str, beat, total: int) -> None:
        super().__init__(name=f"gang-keep-{task_id}", daemon=True)
        self.agent, self.task_id, self.beat, self.total = agent, task_id, beat, total
        self._next: tuple[int, dict] | None = None
        self._wake, self._stopped = threading.Condition(), False
        self.start()

    def keep(self, step: int, arrays: dict) -> None:
        with self._wake:
            self._next = (step, arrays)
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()

    def run(self) -> None:
        while True:
            with self._wake:
                while self._next is None and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
                (step, arrays), self._next = self._next, None
            try:
                shas = self.agent.transfer.upload({k: encode_tensor(v) for k, v in arrays.items()})
            except Exception as exc:  # noqa: BLE001 - any transfer failure: this step stays kept here only
                log.warning("step %d of %s not kept on the coordinator: %s", step, self.task_id, exc)
                continue
            with self._wake:
                if not self._stopped:
                    self.beat.progress = Progress(
                        step=step, total=self.total, other={"resume": {"step": step, "blobs": shas}}
                    )


def _ranked(agent, lease, params: dict, inputs: dict[str, np.ndarray], beat, keep) -> tuple[dict, dict]:
    """This rank's stage 1 in a freshly opened group; `keep(step, arrays)` takes rank 0's kept steps.
    Raises GangBroke when the group cannot open or is lost."""
    gang = params["gang"]
    rank, what = int(gang["rank"]), f"gang rank {gang['rank']} of {gang['degree']}"
    step_s, open_s = float(gang["step_deadline_s"]), float(gang["open_deadline_s"])
    group = None

    def on_step(n: int, video, audio) -> None:
        if beat.stop_reason is not None:
            raise GangBroke(f"the gang ended ({beat.stop_reason})")
        group.arm(step_s)
        if rank == 0:
            keep(n, state_arrays(video, audio))
        log.info("%s for %s: step %d", what, lease.task_id, n)

    try:
        group = SocketGroup.open(rank, list(gang["hosts"]), open_s)
        group.arm(step_s + open_s)  # the first step may load the model
        log.info("%s for %s open", what, lease.task_id)
        with rank_of(agent.runner, group, on_step):
            return agent.runner.run(lease.kind, {k: v for k, v in params.items() if k != "gang"}, inputs)
    except PeerLost as exc:
        raise GangBroke(f"{exc}") from exc
    finally:
        if group is not None:
            group.close()
        log.info("%s for %s left the group", what, lease.task_id)


def run(agent, lease, params: dict, inputs: dict[str, np.ndarray], beat) -> tuple[dict | None, dict]:
    """This worker's rank of the gang: rank 0 returns stage 1's outputs and metrics, a rank > 0 (None, {})."""
    gang, start = params["gang"], time.perf_counter()
    rank, degree = int(gang["rank"]), int(gang["degree"])
    kept: dict = {"step": params.get("resume_step"), "arrays": {}}
    total = len(params.get("sigmas") or [0, 0]) - 1
    keeper = StepKeeper(agent, lease.task_id, beat, total)

    def keep(n: int, arrays: dict) -> None:
        kept["step"], kept["arrays"] = n, arrays
        keeper.keep(n, arrays)

    try:
        outputs, metrics = _ranked(agent, lease, params, inputs, beat, keep)
        if rank != 0:
            return None, {}
        metrics.update(stage1_parallel=degree, seconds=round(time.perf_counter() - start, 4))
        return outputs, metrics
    except GangBroke as exc:
        keeper.stop()
        if rank != 0:
            log.warning("gang rank %d of %d for %s ended: %s", rank, degree, lease.task_id, exc)
            return None, {}
        if beat.stop_reason is not None:
            raise  # the lease is gone (cancelled, taken back): nothing to finish alone
        return _alone(agent, lease, params, inputs, beat, kept, f"{exc}")
    finally:
        keeper.stop()


def _alone(agent, lease, params, inputs, beat, kept, why: str) -> tuple[dict, dict]:
    """Rank 0 after the gang broke: the members told (their beats go stale), stage 1 on from the last
    kept step here (the same result: resume across degrees is exact)."""
    degree, step = int(params["gang"]["degree"]), kept["step"]
    log.warning(
        "sp group of %d for %s broke (%s): stage 1 goes on on this worker from step %s",
        degree,
        lease.task_id,
        why,
        step or 0,
    )
    beat.progress = Progress(other={"gang_ended": True, "reason": why[:200]})
    alone = {k: v for k, v in params.items() if k != "gang"}
    if step is not None:
        alone["resume_step"] = step
    inputs = {**inputs, **kept["arrays"]}
    outputs, metrics = agent.runner.run(lease.kind, alone, inputs)
    metrics.update(stage1_parallel=1, gang_broke=why[:200], gang_resumed_at=step or 0)
    return outputs, metrics


__all__ = ["capabilities", "is_gang", "run", "state_arrays"]
