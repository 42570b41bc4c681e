"""A gang member's part of a sequence-parallel stage 1, with its watchdog.

The lease reply carries the handout (`params.gang`: rank, degree, host:port per rank, deadlines; see
coordinator/state/lua/gang.lua). The rank runs in a child process (worker/gang_rank.py) so a collective
stuck on a frozen, killed or unreachable peer is killed, never waited on: the group must open within
`open_deadline_s` and each step must finish within `step_deadline_s` (the cost model's step × a
margin, with a floor), else the child's process group is killed. Rank 0 holds the lease: it uploads
the states after each step as blobs and reports them in its heartbeat (the coordinator keeps them on
the task, so a re-lease resumes there), and when the gang breaks it says so (the members' heartbeats
then go stale and they kill their ranks) and finishes stage 1 alone from the last kept step, which is
bit-identical (sequence parallel is exact here). A rank > 0 reports nothing: its part just ends.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

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
    """The group did not open, a rank failed, or a step passed its deadline: a peer's trouble, not the
    task's (worker/faults.py reads `transient`)."""

    transient = True


def _start(folder: Path, params: dict, inputs: dict[str, np.ndarray], runner) -> subprocess.Popen:
    gang, packs_dir = params["gang"], getattr(runner, "packs_dir", None)
    task = {
        "params": {k: v for k, v in params.items() if k != "gang"},
        "rank": gang["rank"],
        "hosts": gang["hosts"],
        "packs_dir": str(packs_dir) if packs_dir else None,
        "throttle": float(getattr(runner, "throttle", 1.0)),  # a slower (shared) Mac stays as slow
        "loras": _lora_files(runner, params),
    }
    (folder / "task.json").write_text(json.dumps(task))
    np.savez(folder / "inputs.npz", **inputs)
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "worker.gang_rank", str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )


def _lora_files(runner, params: dict) -> dict[str, str]:
    """The render's user LoRA blobs as files here (fetched once by this worker): the rank process has
    no coordinator to fetch them from."""
    loras = getattr(runner, "loras", None)
    blobs = [lora for lora in params.get("loras") or () if isinstance(lora, dict) and lora.get("blob")]
    return {str(lora["blob"]): str(loras.path(None, lora)) for lora in blobs} if loras is not None else {}


def _lines(proc: subprocess.Popen) -> queue.Queue:
    out: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            out.put(line.strip())
        out.put(None)

    threading.Thread(target=read, daemon=True).start()
    return out


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def watch(proc: subprocess.Popen, gang: dict, beat, on_step) -> None:
    """Follow the rank's lines under its deadlines; raise GangBroke (the child killed) when it breaks."""
    lines, tail = _lines(proc), []
    step_s, open_s = float(gang["step_deadline_s"]), float(gang["open_deadline_s"])
    deadline, opened = time.monotonic() + open_s, False
    try:
        while True:
            if beat.stop_reason is not None:
                raise GangBroke(f"the gang ended ({beat.stop_reason})")
            left = deadline - time.monotonic()
            if left <= 0:
                raise GangBroke(
                    f"{'step' if opened else 'group open'} past its deadline "
                    f"({step_s if opened else open_s:.0f} s)"
                )
            try:
                line = lines.get(timeout=min(left, 0.2))
            except queue.Empty:
                continue
            if line is None:
                proc.wait()
                raise GangBroke(f"rank exited {proc.returncode}: {' | '.join(tail[-3:])}")
            tail.append(line)
            if line == "OPEN":
                opened, deadline = True, time.monotonic() + step_s + open_s  # the first step loads the model
            elif line.startswith("STEP "):
                on_step(int(line.split()[1]))
                deadline = time.monotonic() + step_s
            elif line == "DONE":
                return
    finally:
        _kill(proc)


class StepKeeper(threading.Thread):
    """Rank 0's kept steps, uploaded beside the watchdog (an upload that waits for a restarting
    coordinator must not hold the deadlines up): the latest step wins, and once stopped nothing more
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


def run(agent, lease, params: dict, inputs: dict[str, np.ndarray], beat) -> tuple[dict | None, dict]:
    """This worker's rank of the gang: rank 0 returns stage 1's outputs and metrics, a rank > 0 (None, {})."""
    gang, start = params["gang"], time.perf_counter()
    rank, degree = int(gang["rank"]), int(gang["degree"])
    folder = Path(tempfile.mkdtemp(prefix="farm-gang-"))
    kept: dict = {"step": params.get("resume_step"), "arrays": {}}
    total = len(params.get("sigmas") or [0, 0]) - 1

    keeper = StepKeeper(agent, lease.task_id, beat, total)

    def on_step(n: int) -> None:
        if rank != 0:
            return
        with np.load(folder / f"step{n}.npz") as data:
            kept["step"], kept["arrays"] = n, {k: data[k] for k in data.files}
        keeper.keep(n, kept["arrays"])

    try:
        watch(_start(folder, params, inputs, agent.runner), gang, beat, on_step)
        if rank != 0:
            return None, {}
        with np.load(folder / "out.npz") as data:
            outputs = {k: data[k] for k in data.files}
        metrics = json.loads((folder / "metrics.json").read_text())
        metrics.update(stage1_parallel=degree, seconds=round(time.perf_counter() - start, 4))
        return outputs, metrics
    except GangBroke as exc:
        keeper.stop()
        if rank != 0:
            log.warning("gang rank %d of %d for %s ended: %s", rank, degree, lease.task_id, exc)
            return None, {}
        return _alone(agent, lease, params, inputs, beat, kept, f"{exc}")
    finally:
        keeper.stop()
        shutil.rmtree(folder, ignore_errors=True)


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
