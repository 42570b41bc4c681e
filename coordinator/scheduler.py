"""The scheduler: hands tasks to pulling workers, expires dead leases, checks results, assembles.

Workers long-poll Lease; the scheduler turns that into short FarmStore.lease attempts so Redis
stays the only source of truth (no in-memory queue to lose). A result is checked against the
planner's params["expect"] (results.py) before it may commit: a missing blob or a wrong dtype/shape is refused
and the task re-queued, so one bad worker cannot poison a render. The assembler runs in a thread once
the last task commits (a tiled decode's frames already encoded: early_encodes.py); the render ends done or failed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from coordinator.assemble.early_encodes import EarlyEncodes
from coordinator.leadership import LostEpoch, check_epoch
from coordinator.results import as_dict, check_outputs
from coordinator.state.blobs import BlobStore
from coordinator.state.store import NotLeader, is_transient
from protos.defaults import LEASE_MS
from protos.retry import Backoff, GaveUp, Outage, retry
from protos.states import Outcome, RenderState

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 2.0  # how often the housekeeping loop looks for renders whose assembly is due


@dataclass(frozen=True)
class StuckLimits:
    """When a running task is flagged stuck (soft) and when it is taken away and re-queued (hard):
    max(floor, factor x the mean time of finished tasks of its kind). Floors are generous because the
    first task of a kind has no mean yet, and a big stage 1 on a small Mac takes many minutes."""

    soft_floor_s: float = 600.0
    soft_factor: float = 3.0
    hard_floor_s: float = 7200.0
    hard_factor: float = 10.0


class SchedulerStore(Protocol):
    """The store calls the scheduler makes: leases, results, expiry and the renders it assembles."""

    def lease(self, worker_id: str, capabilities: list[str], lease_ms: int, seen: bool = False) -> dict | None: ...

    def complete_and_lease(self, task_id: str, worker_id: str, fence: int, outputs: dict[str, str], metrics: dict,
                           capabilities: list[str], lease_ms: int) -> tuple[str, dict | None]: ...

    def fail(self, task_id: str, worker_id: str, fence: int, error: str, retryable: bool = True,
             seen: bool = False, fault: str = "") -> str: ...

    def expire_leases(self, now_ms: int | None = None) -> list[str]: ...

    def check_stuck(self, soft_floor_ms: int, soft_factor: float, hard_floor_ms: int,
                    hard_factor: float) -> tuple[list[str], list[str]]: ...

    def get_task(self, task_id: str) -> dict | None: ...

    def get_render(self, render_id: str) -> dict | None: ...

    def list_renders(self, limit: int = 50) -> list[dict]: ...

    def render_tasks(self, render_id: str) -> list[dict]: ...

    def renders_to_assemble(self) -> list[str]: ...

    def set_render_state(self, render_id: str, state: str, **fields: Any) -> bool: ...


class Scheduler:
    """Lease long-poll, lease expiry and result checking on top of a FarmStore."""

    def __init__(self, store: SchedulerStore, blobs: BlobStore, data_dir: Path, *, lease_ms: int = LEASE_MS,
                 poll_s: float = 0.05, expiry_interval_s: float = 1.0, stuck: StuckLimits | None = None) -> None:
        self.store = store
        self.stuck = stuck or StuckLimits()
        self.blobs = blobs
        self.data_dir = Path(data_dir)
        self.lease_ms = lease_ms
        self.poll_s = poll_s
        self.expiry_interval_s = expiry_interval_s
        self._stop = threading.Event()
        self._expiry: threading.Thread | None = None
        self._assembling: set[str] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        # Waiting lease polls by capability list, longest waiting first: a wake sets one of each, not all.
        self._waiting: dict[tuple[str, ...], list[threading.Event]] = {}
        self._waiting_lock = threading.Lock()
        # What a result is checked against, remembered from the lease reply (task id -> (fence, expect,
        # render)) so a completion costs one Lua call, not an HGETALL first. Redis stays the truth: a
        # miss (another coordinator leased it, an old fence) reads the task as before.
        self._leased: dict[str, tuple[int, dict, str]] = {}
        self.early = EarlyEncodes(store, blobs, self.data_dir, fence=lambda: check_epoch(self.store))

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Resume unfinished assemblies and expire leases; may run again after stop() (a coordinator
        that stood by and leads again)."""
        self._stop.clear()
        try:
            self.resume_assemblies()
        except Exception as exc:  # noqa: BLE001 - Redis away at start: the housekeeping sweep resumes them
            log.warning("resuming assemblies at start: %s; the sweep will retry", exc)
        if self._expiry is None or not self._expiry.is_alive():
            self._expiry = threading.Thread(target=self._expiry_loop, name="lease-expiry", daemon=True)
            self._expiry.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake_all()
        if self._expiry is not None:
            self._expiry.join(timeout)
        self.early.stop()
        for t in list(self._threads):
            t.join(timeout)

    def _expiry_loop(self) -> None:
        """Housekeeping: re-queue tasks whose worker stopped heartbeating (frozen, asleep, cut off), flag
        or take back stuck tasks, and every few seconds resume assemblies a blip interrupted. No error
        ends it; an outage is logged once when it starts and once when it ends."""
        outage, deposed = Outage("lease expiry", log), LostEpoch("lease expiry", log)
        last_sweep = 0.0
        while not self._stop.wait(self.expiry_interval_s):
            try:
                self._expire_and_check()
                if time.monotonic() - last_sweep >= SWEEP_EVERY_S:
                    self.resume_assemblies(full=False)
                    last_sweep = time.monotonic()
                deposed.ok()
            except NotLeader as exc:
                deposed.note(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - keep the loop alive through anything
                if not is_transient(exc) and not outage.down:
                    log.exception("lease expiry failed")
                outage.failed(exc)
                continue
            outage.ok()

    def _expire_and_check(self) -> None:
        expired = self.store.expire_leases()
        if expired:
            log.info("expired leases: %s", ", ".join(map(str, expired)))
        s = self.stuck
        flagged, cancelled = self.store.check_stuck(int(s.soft_floor_s * 1000), s.soft_factor,
                                                    int(s.hard_floor_s * 1000), s.hard_factor)
        if flagged:
            log.warning("tasks running far past their kind's time: %s", ", ".join(flagged))
        if cancelled:
            log.warning("stuck tasks taken back from their workers and queued again: %s", ", ".join(cancelled))
        if expired or cancelled:
            self.wake()

    # ------------------------------------------------------------------ leasing

    def wake(self) -> None:
        """Tasks may have become ready (a submit, a result, an expiry): wake the longest-waiting lease of
        each capability list, not every one (a thundering herd of Lua calls that find nothing). A woken
        lease that gets a task wakes the next (more may be ready); the fallback poll covers the rest."""
        with self._waiting_lock:
            for waiters in self._waiting.values():
                if waiters:
                    waiters.pop(0).set()

    def _wake_next(self, capabilities: tuple[str, ...]) -> None:
        with self._waiting_lock:
            waiters = self._waiting.get(capabilities)
            if waiters:
                waiters.pop(0).set()

    def _wake_all(self) -> None:
        with self._waiting_lock:
            for waiters in self._waiting.values():
                for event in waiters:
                    event.set()
                waiters.clear()

    def _wait(self, capabilities: tuple[str, ...], timeout: float) -> bool:
        """Sleep until woken or `timeout`; True when a wake (not the clock) ended it."""
        event = threading.Event()
        with self._waiting_lock:
            self._waiting.setdefault(capabilities, []).append(event)
        if event.wait(timeout):
            return True
        with self._waiting_lock:
            waiters = self._waiting.get(capabilities, [])
            if event in waiters:
                waiters.remove(event)
                return False
        return True  # set between the timeout and the lock: it was a wake

    def wait_for_work(self, timeout: float, capabilities: tuple[str, ...] = ()) -> bool:
        """Sleep until woken or `timeout`; False once the scheduler stops."""
        self._wait(tuple(capabilities), timeout)
        return not self._stop.is_set()

    def lease(self, worker_id: str, capabilities: list[str], wait_ms: int,
              is_active: Callable[[], bool] = lambda: True, seen: bool = True) -> dict | None:
        """Poll the store until a task is leased, wait_ms passes, the caller leaves or we stop. Each poll
        is one Lua call that also marks the worker seen (seen=True: a worker asks)."""
        deadline = time.monotonic() + max(0, wait_ms) / 1000.0
        delay, caps, woken = self.poll_s, tuple(capabilities), False
        while True:
            task = self.store.lease(worker_id, list(caps), self.lease_ms, seen=seen)
            if task is not None:
                self._remember(task)
                if woken:
                    self._wake_next(caps)  # the wake may have readied more than one task
                return task
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not is_active() or self._stop.is_set():
                return None
            woken = self._wait(caps, min(delay, remaining))
            if self._stop.is_set():
                return None
            delay = min(delay * 1.5, max(self.poll_s, 0.25))  # the fallback poll, for other processes' changes

    def _remember(self, task: dict) -> None:
        expect = as_dict(as_dict(task.get("params")).get("expect"))
        with self._waiting_lock:
            self._leased[str(task["id"])] = (int(task["fence"]), expect, str(task.get("render") or ""))
            if len(self._leased) > 10_000:  # leases never completed (lost workers): forget the oldest
                del self._leased[next(iter(self._leased))]

    def _recall(self, task_id: str, fence: int) -> tuple[dict, str] | None:
        """(expect, render) of a lease this coordinator granted under this fence, else None."""
        with self._waiting_lock:
            got = self._leased.get(task_id)
            if got is None or got[0] != int(fence):
                return None
            del self._leased[task_id]
        return got[1], got[2]

    # ------------------------------------------------------------------ results

    def check_outputs(self, expect: dict, outputs: dict[str, str]) -> str | None:
        """Why these outputs must be refused, or None when they match the task's params["expect"]."""
        return check_outputs(self.blobs, expect, outputs)

    def complete(
        self, task_id: str, worker_id: str, fence: int, outputs: dict[str, str], metrics: dict
    ) -> tuple[str, str]:
        """Check then commit a worker's result (one Lua call when this coordinator granted the lease).
        Returns (status, message); status is a store status string."""
        status, message, _ = self.complete_and_lease(task_id, worker_id, fence, outputs, metrics, [])
        return status, message

    def complete_and_lease(
        self, task_id: str, worker_id: str, fence: int, outputs: dict[str, str], metrics: dict,
        capabilities: list[str],
    ) -> tuple[str, str, dict | None]:
        """complete(), then the worker's next lease when it lists capabilities (no waiting: the worker
        long-polls), both in one Lua call when this coordinator granted the lease and the result checks.
        Returns (status, message, the next task or None)."""
        recalled = self._recall(task_id, fence)
        if recalled is None:
            task = self.store.get_task(task_id)
            if task is None:
                return Outcome.STALE, f"unknown task {task_id}", self._lease_now(worker_id, capabilities)
            recalled = as_dict(as_dict(task.get("params")).get("expect")), str(task.get("render") or "")
        expect, render_id = recalled
        problem = self.check_outputs(expect, outputs)
        if problem is not None:
            log.warning("refusing result of %s from %s: %s", task_id, worker_id, problem)
            status = self.store.fail(task_id, worker_id, fence, f"result refused: {problem}", retryable=True,
                                     seen=True)
            self.wake()
            return status, problem, self._lease_now(worker_id, capabilities)
        status, task = self.store.complete_and_lease(task_id, worker_id, fence, dict(outputs), metrics,
                                                     list(capabilities), self.lease_ms)
        if task is not None:
            self._remember(task)
        self.wake()
        if status in (Outcome.OK, Outcome.RENDER_READY):  # a decode tile's frames may go to the encoder
            self.early.landed(render_id, task_id)
        if status == Outcome.RENDER_READY:
            self.start_assembly(render_id)
        return status, "", task

    def _lease_now(self, worker_id: str, capabilities: list[str]) -> dict | None:
        return self.lease(worker_id, capabilities, 0) if capabilities else None

    # ------------------------------------------------------------------ assembly

    def resume_assemblies(self, full: bool = True) -> list[str]:
        """Renders whose every task is done but whose mp4 was never finished (a coordinator died
        assembling, a blip broke the assembly, the reply of the last result was lost) are assembled
        again. full: scan every render (at start); else only the store's to-assemble set (the sweep)."""
        if full:
            due = [str(r["id"]) for r in self.store.list_renders(limit=1000)
                   if r.get("state") in (RenderState.RUNNING, RenderState.ASSEMBLING) and int(r.get("remaining") or 0) == 0]
        else:
            due = self.store.renders_to_assemble()
        resumed = []
        for render_id in due:
            if self.start_assembly(render_id) is not None:
                log.info("resuming assembly of %s", render_id)
                resumed.append(render_id)
        return resumed

    def start_assembly(self, render_id: str) -> threading.Thread | None:
        """Assemble in the background so the worker's Complete call returns at once."""
        with self._lock:
            if render_id in self._assembling:
                return None
            self._assembling.add(render_id)
        thread = threading.Thread(
            target=self._assemble_guarded, args=(render_id,), name=f"assemble-{render_id}"
        )
        thread.daemon = True
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        return thread

    def _assemble_guarded(self, render_id: str) -> None:
        """Assemble until it works or fails for a reason waiting cannot fix, then record the outcome,
        retried until it lands. On stop the render stays due, and the next start resumes it."""
        try:
            outcome = self._assemble_through_blips(render_id)
            if outcome is not None:
                state, fields = outcome
                retry(lambda: self.store.set_render_state(render_id, state, **fields), f"marking {render_id} {state}",
                      transient=is_transient, log=log, stop=self._stop)
        except (GaveUp, NotLeader):
            log.info("assembly of %s interrupted by a stop; it resumes on the next start", render_id)
        finally:
            with self._lock:
                self._assembling.discard(render_id)

    def _assemble_through_blips(self, render_id: str) -> tuple[str, dict] | None:
        """("done", {output}) or ("failed", {error}); None when stopping or the render already ended.
        A transient error (Redis, blob I/O) starts the assembly over after a pause: it is a pure
        function of the task outputs, so the file comes out the same."""
        outage, backoff = Outage(f"assembly of {render_id}", log), Backoff(first_s=0.2, max_s=5.0)
        while not self._stop.is_set():
            try:
                if not self.store.set_render_state(render_id, RenderState.ASSEMBLING, stage="assemble"):
                    return None  # cancelled or finished meanwhile
                path = self.assemble(render_id)
                outage.ok()
                return RenderState.DONE, {"output": str(path)}
            except NotLeader:
                return None  # another coordinator leads now and resumes this assembly
            except Exception as exc:  # noqa: BLE001 - sorted below: wait it out, or fail the render
                if is_transient(exc):
                    outage.failed(exc)
                    self._stop.wait(backoff.delay())
                    continue
                log.exception("assembly of %s failed", render_id)
                return RenderState.FAILED, {"error": f"assembly failed: {type(exc).__name__}: {exc}".splitlines()[0]}
        return None

    def task_outputs(self, render_id: str) -> tuple[dict[str, dict[str, str]], list[dict]]:
        """Each task's outputs by its name in the plan ("decode.t3"), and its run record for the metadata
        (worker, lease → done times, the worker's own seconds, what produced it: chip, versions, class)."""
        prefix = f"{render_id}."
        outputs: dict[str, dict[str, str]] = {}
        runs: list[dict] = []
        for task in self.store.render_tasks(render_id):
            tid = str(task["id"])
            name = tid[len(prefix):] if tid.startswith(prefix) else tid
            outputs[name] = as_dict(task.get("outputs"))
            runs.append({"name": name, "kind": task.get("kind"), "worker": task.get("worker") or None,
                         "start_ms": int(task.get("leased_ms") or 0), "end_ms": int(task.get("done_ms") or 0),
                         "seconds": as_dict(task.get("metrics")).get("seconds"),
                         "made_by": as_dict(task.get("made_by"))})
        return outputs, runs

    def assemble(self, render_id: str) -> Path:
        """Synchronous assembly: task outputs streamed (one blob at a time) into the assembler → the mp4."""
        from coordinator.assemble import assembler

        render = self.store.get_render(render_id)
        if render is None:
            raise RuntimeError(f"render {render_id} vanished")
        out_dir = self.data_dir / "renders" / render_id
        out_dir.mkdir(parents=True, exist_ok=True)
        outputs, runs = self.task_outputs(render_id)

        def get(name: str, output: str) -> Any:
            sha = outputs.get(name, {}).get(output)
            if sha is None:
                return None
            # decode tiles (up to ~300 MiB each) are read a frame at a time by the blend, never whole
            return self.blobs.tensor_frames(sha) if output == "pixels" else self.blobs.read_tensor(sha)

        preview = self.data_dir / "previews" / f"{render_id}.png"
        spec = as_dict(render.get("spec"))
        exr_dir = out_dir / "exr" if spec.get("exr") else None  # clients fetch them (FetchOutput file=)
        early = self.early.finish(render_id, outputs, get, runs)  # encoded while the decode ran
        return early or Path(assembler.assemble_streaming(spec, get, out_dir, runs, preview, exr_dir,
                                                          fence=lambda: check_epoch(self.store)))
