"""`farm worker`: the agent on each Mac. It pulls tasks; it never talks to Redis.

Loop: register (capabilities from Runner.capabilities()) -> long-poll Lease -> fetch inputs
(verified, cached by sha256) -> Runner.run with a heartbeat thread reporting step progress ->
upload outputs -> Complete with the lease's fence. A heartbeat answer of CANCEL or STALE stops the
run: the work is discarded and reported, never committed. When the coordinator is away the agent
backs off and re-registers; SIGTERM/SIGINT stop it cleanly (a running task is handed back).

Beside it (the size rule): worker/heartbeat.py (the per-task heartbeat thread), worker/transfer.py
(blob fetch and upload), worker/cli.py (`main`, `run_worker`: flags, token, signals), which
worker/agent/__main__.py runs for `python -m worker.agent`.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from protos import defaults, farm_pb2, farm_pb2_grpc
from protos.auth import auth_metadata, read_token
from protos.records import Progress, WorkerCapabilities
from protos.states import Fault
from protos.tensors import encode_tensor
from worker import gang
from worker.blobcache import BlobCache
from worker.connection import RECONNECT_MAX_S, RESULT_RETRY_S, RPC_TIMEOUT_S, Coordinators, default_worker_id
from worker.faults import classify
from worker.heartbeat import Heartbeat
from worker.packsync import PackSync
from worker.packwatch import PackWatch, listing
from worker.prefetch import UPCOMING_TIMEOUT_S, Prefetcher
from worker.presence import Presence
from worker.tasklog import TaskLog
from worker.transfer import BlobTransfer

log = logging.getLogger("farm.worker")

RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
STOP_GRACE_S = 1.0  # on stop, how long an in-flight Lease reply may take to land
DEFAULT_CAPABILITIES = ("mlx",)


class StopRun(Exception):
    """Raised inside progress() to unwind a run the coordinator no longer wants."""


def lease_capabilities(caps: WorkerCapabilities) -> list[str]:
    """Ready queues this worker serves: the runner's explicit list, else the MLX queue (graph.CAPABILITY)."""
    explicit = caps.lease_queues
    if isinstance(explicit, list) and explicit:
        return [str(c) for c in explicit]
    return list(DEFAULT_CAPABILITIES)


class Agent:
    """One worker process: a channel to the coordinator, a runner, a blob cache."""

    def __init__(
        self,
        address: str,
        token: str,
        runner: Any,
        *,
        worker_id: str | None = None,
        cache_dir: Path | None = None,
        wait_ms: int = 10_000,
        pack_max_bytes_per_s: float | None = None,
        token_file: Path | None = None,
    ) -> None:
        self.coordinators = Coordinators(address, token)  # "host:port[,host:port...]": the leader is followed
        self.runner = runner
        self.worker_id = worker_id or default_worker_id()
        self.metadata = list(auth_metadata(token))  # one list: Presence, PackSync, transfers see a new token too
        self.token_file = token_file  # read again when the coordinator refuses us (`farm token rotate`)
        self.wait_ms = wait_ms
        self.cache = BlobCache(cache_dir or Path.home() / ".cache" / "ltx-farm" / "blobs")
        self.channel = self.coordinators.channel()
        self.stopping = threading.Event()
        self.transfer = BlobTransfer(self.coordinators, self.metadata, self.cache, self.stopping)
        if hasattr(runner, "loras"):  # user LoRA files: fetched once from the coordinator, kept by sha256
            runner.loras.root, runner.loras.fetch = self.cache.root.parent / "loras", self.transfer.fetch_blob
        self.prefetch = Prefetcher(  # the next task's inputs fetched while this one's forward runs
            lambda request: self.worker.Upcoming(request, timeout=UPCOMING_TIMEOUT_S, metadata=self.metadata),
            self.transfer.fetch_blob, self.cache.has)
        self.draining = threading.Event()  # finish the current task, take no more, exit
        self._drain_lifts_with_mark = False  # a coordinator's drain, which its resume undoes
        self._registered_once = False
        self.capabilities = WorkerCapabilities()
        self.heartbeat_ms = 10_000
        self.tasks_done = 0
        self.next_lease: farm_pb2.LeaseReply | None = None  # leased in the last Complete's reply
        self.session = secrets.token_hex(8)  # this process: a new one tells the farm the last one is gone
        self.presence = Presence(lambda: self.worker, self.worker_id, self.session, self.metadata)
        packs_dir = getattr(runner, "packs_dir", None)  # packs it lacks are copied here from the coordinator
        self.packsync = PackSync(self.coordinators.channel, self.metadata, self.worker_id, packs_dir,
                                 pack_max_bytes_per_s) if packs_dir else None
        self.packwatch = PackWatch(Path(packs_dir)) if packs_dir else None  # packs written here while we run

    @property
    def address(self) -> str:
        """The coordinator this agent talks to now."""
        return self.coordinators.address

    @property
    def worker(self) -> farm_pb2_grpc.FarmWorkerStub:
        return self.coordinators.worker()

    @property
    def blobs(self) -> farm_pb2_grpc.FarmBlobsStub:
        return self.coordinators.blobs()

    def _reload_token(self) -> bool:
        """After a refusal: a token file that now holds another token (`farm token rotate`, a fresh
        copy) is used at once, by every stub of the agent (they share self.metadata)."""
        if self.token_file is None:
            return False
        try:
            fresh = list(auth_metadata(read_token(self.token_file)))
        except (OSError, ValueError):
            return False
        if fresh == self.metadata:
            return False
        self.metadata[:] = fresh
        log.info("the token in %s changed: using it", self.token_file)
        return True

    def stop(self) -> None:
        self.stopping.set()

    def drain(self, by_coordinator: bool = False) -> None:
        """Finish the current task, take no more, exit (SIGUSR1, or the coordinator's drain mark)."""
        if not self.draining.is_set():
            log.info("draining: finishing the current task, then exiting")
            self._drain_lifts_with_mark = by_coordinator  # SIGUSR1's drain is this Mac's own: kept
        self.draining.set()

    def resume(self) -> None:
        """A drain the coordinator asked for and then took back, before this worker left: serve on."""
        if self.draining.is_set() and self._drain_lifts_with_mark:
            log.info("resumed: the coordinator lifted the drain; serving on")
            self.draining.clear()

    # ------------------------------------------------------------------ main loop

    def run(self, max_tasks: int | None = None) -> int:
        """Serve until stopped. Returns a process exit code."""
        backoff = 0.5
        registered = False
        while not self.stopping.is_set() and not self.draining.is_set():
            address = self.address
            try:
                if not registered:
                    self.register()
                    registered = True
                    backoff = 0.5
                lease, self.next_lease = self.next_lease or self.lease(), None
                if lease is not None:
                    self.run_task(lease, lease_next=max_tasks is None or self.tasks_done + 1 < max_tasks)
                    self.tasks_done += 1
                    if max_tasks is not None and self.tasks_done >= max_tasks:
                        break
                if self._packs_arrived() or (self.packwatch is not None and self.packwatch.settled_change()):
                    registered = False  # register again: the new pack is in our capabilities
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    if self._reload_token():
                        registered = False
                        continue
                    log.error("coordinator refused our token; check --token-file / FARM_TOKEN")
                    return 2
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and not registered:
                    log.error("%s", exc.details())  # another project version: the line says how to upgrade
                    return 2
                if exc.code() not in RETRY_CODES and exc.code() != grpc.StatusCode.CANCELLED:
                    log.error("coordinator error %s: %s", exc.code(), exc.details())
                else:  # the code and gRPC's reason: a refused port reads unlike a call that hung to its deadline
                    log.warning("coordinator at %s unreachable (%s: %s); retrying in %.1fs", address,
                                exc.code().name, exc.details() or "no detail", backoff)
                self.coordinators.follow(exc, address)
                registered = False
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)
        if self.next_lease is not None:  # leased with the last result, never started: hand it back
            self._report_fail(self.next_lease, "worker shutting down", Fault.TRANSIENT)
        if self.draining.is_set():
            log.info("drained: exiting")
        self.presence.stop()
        self.coordinators.close()
        return 0

    def register(self) -> None:
        seen = listing(self.packwatch.packs_dir) if self.packwatch is not None else ()
        self.capabilities = WorkerCapabilities.from_dict({**self.runner.capabilities(), **gang.capabilities()})
        request = farm_pb2.WorkerInfo(
            worker_id=self.worker_id, capabilities_json=self.capabilities.to_json(), resumed=self._registered_once,
            # registered between tasks only: a lease the farm has for us was never received (unless it
            # came with the last result and is about to run)
            idle=self.next_lease is None,
            session=self.session,
        )
        address = self.address
        reply = self.worker.Register(request, timeout=RPC_TIMEOUT_S, metadata=self.metadata)
        self.transfer.announce(address, reply.bulk_port, reply.bulk_tls)  # blobs at line rate, when it has one
        self._registered_once = True
        if self.packwatch is not None:
            self.packwatch.mark_registered(seen)
        self.heartbeat_ms = int(reply.heartbeat_ms) or defaults.heartbeat_ms(reply.lease_ms)
        if not self.presence.is_alive():
            self.presence.start()  # the Attach stream: our death is noticed from it at once
        mine = self.capabilities.other
        log.info("registered %s with %s (heartbeat %d ms; packs: %s; ltx-farm %s, mlx %s, class %s)", self.worker_id,
                 self.address, self.heartbeat_ms, ", ".join(self.capabilities.packs or []) or "none",
                 mine.get("project_version", "?"), mine.get("mlx_version", "?"), mine.get("fingerprint", "-"))

    def _packs_arrived(self) -> bool:
        """Between leases: start copying packs unfinished renders need; True once a copy finished."""
        if self.packsync is None:
            return False
        self.packsync.poll()
        if self.packsync.changed.is_set():
            self.packsync.changed.clear()
            return True
        return False

    def lease(self) -> farm_pb2.LeaseReply | None:
        """Long poll, abandoned promptly when the agent is asked to stop. A lease granted as the agent stops
        is let land (briefly) and handed straight back, so it is not stranded until its deadline."""
        request = farm_pb2.LeaseRequest(
            worker_id=self.worker_id, capabilities=lease_capabilities(self.capabilities), wait_ms=self.wait_ms
        )
        future = self.worker.Lease.future(request, timeout=self.wait_ms / 1000 + 10, metadata=self.metadata)
        landed = threading.Event()  # wakes the loop the moment the reply lands, not at the next tick
        future.add_done_callback(lambda _f: landed.set())
        while not landed.wait(0.1):
            if self.stopping.is_set():
                try:
                    future.result(timeout=STOP_GRACE_S)
                except grpc.FutureTimeoutError:
                    future.cancel()
                    return None
                break
        reply = future.result()
        if reply.drain:
            self.drain()
        if not reply.has_task:
            return None
        if self.stopping.is_set():
            log.info("task %s leased as we stop: handing it back", reply.task_id)
            self._report_fail(reply, "worker shutting down", Fault.TRANSIENT)
            return None
        return reply

    # ------------------------------------------------------------------ one task

    def run_task(self, lease: farm_pb2.LeaseReply, lease_next: bool = False) -> str:
        """Run one leased task to a reported end. Returns the coordinator's final status name. lease_next:
        the Complete call asks for the next task too (kept in self.next_lease): one RPC per task."""
        tasklog = TaskLog.start()  # this task's log lines travel with its result (`farm logs`)
        log.info("task %s (%s) of %s, lease %d", lease.task_id, lease.kind, lease.render_id, lease.attempts)
        beat = Heartbeat(self, lease, self.heartbeat_ms / 1000.0)
        beat.start()

        def progress(step: int, total: int) -> None:
            beat.progress = Progress(step=int(step), total=int(total))

        def cancelled() -> bool:
            return beat.stop_reason is not None or self.stopping.is_set()

        try:
            if self.packsync is not None:  # a pack only the coordinator holds: copy it before running
                self.packsync.ensure(str(json.loads(lease.params_json or "{}").get("pack") or ""))
            inputs, moved = self._fetch_inputs(lease, lease_next)
            beat.progress = Progress(phase="run")  # the next beat tells the dashboard: computing, not fetching
            params = json.loads(lease.params_json or "{}")
            if gang.is_gang(params):  # this worker's rank of a sequence-parallel stage 1
                outputs, metrics = gang.run(self, lease, params, inputs, beat)
                if outputs is None:
                    return "GANG_RANK_DONE"  # rank 0 reports the task
            else:
                outputs, metrics = self.runner.run(lease.kind, params, inputs, progress, cancelled)
            if cancelled():
                return self._report_fail(lease, self._stop_reason(beat), Fault.TRANSIENT)
            ran = time.perf_counter()
            encoded = {name: encode_tensor(np.asarray(arr)) for name, arr in outputs.items()}
            shas = self.transfer.upload(encoded)
            metrics.update(moved, upload_s=round(time.perf_counter() - ran, 4), log=tasklog.lines(),
                           bytes_out=int(sum(len(d) for d in encoded.values())))
            return self._complete(lease, shas, metrics, lease_next)
        except grpc.RpcError as exc:
            if exc.code() in RETRY_CODES or exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise  # coordinator away: the run loop backs off; the lease expires and is re-queued
            return self._report_fail(lease, f"coordinator refused: {exc.code().name}: {exc.details()}",
                                     Fault.TRANSIENT)
        except Exception as exc:
            if cancelled():
                return self._report_fail(lease, self._stop_reason(beat), Fault.TRANSIENT)
            log.exception("task %s failed", lease.task_id)
            fault = classify(exc)  # a permanent error's text is written for the user: no class name
            error = str(exc) if fault == Fault.PERMANENT else f"{type(exc).__name__}: {exc}"
            return self._report_fail(lease, error, fault)
        finally:
            beat.finish()
            tasklog.stop()

    def _taking_more(self, lease_next: bool) -> bool:
        return lease_next and not (self.stopping.is_set() or self.draining.is_set())

    def _fetch_inputs(self, lease: farm_pb2.LeaseReply, lease_next: bool) -> tuple[dict[str, np.ndarray], dict]:
        """The task's inputs (most often warmed in the cache during the last forward), and what moving them
        cost; then the next task's warm-up starts, to run beside this forward."""
        start = time.perf_counter()
        self.prefetch.settle(lease.inputs.values())
        warm = sum(self.cache.has(sha) for sha in set(lease.inputs.values()))
        inputs = self.transfer.fetch_inputs(dict(lease.inputs))
        moved = {"fetch_s": round(time.perf_counter() - start, 4), "inputs_warm": warm,
                 "bytes_in": int(sum(a.nbytes for a in inputs.values()))}
        if self._taking_more(lease_next):
            self.prefetch.start(self._lease_request())
        return inputs, moved

    def _complete(self, lease: farm_pb2.LeaseReply, shas: dict[str, str], metrics: dict, lease_next: bool) -> str:
        """Commit the result (the next lease rides on the reply); returns the coordinator's status name."""
        request = farm_pb2.CompleteRequest(task_id=lease.task_id, worker_id=self.worker_id, fence=lease.fence,
                                           outputs=shas, metrics_json=json.dumps(metrics, default=float))
        if self._taking_more(lease_next):
            request.next.CopyFrom(self._lease_request())
        reply = self._retrying(lambda stub: stub.Complete, request)
        self._keep_next(reply)
        status = farm_pb2.TaskStatus.Name(reply.status)
        if reply.message:
            log.warning("task %s result refused: %s", lease.task_id, reply.message)
        log.info("task %s: %s", lease.task_id, status)
        return status

    def _lease_request(self) -> farm_pb2.LeaseRequest:
        """What this worker asks for: its id and the queues it serves (no wait: a lease riding on a reply)."""
        return farm_pb2.LeaseRequest(worker_id=self.worker_id, capabilities=lease_capabilities(self.capabilities))

    def _keep_next(self, reply: farm_pb2.StatusReply) -> None:
        """The lease that came with a result: run next (or handed back when we stop meanwhile)."""
        if not reply.HasField("next"):
            return
        if reply.next.drain:
            self.drain()
        if reply.next.has_task:
            self.next_lease = reply.next

    def _stop_reason(self, beat: Heartbeat) -> str:
        return beat.stop_reason or "worker shutting down"

    def _report_fail(self, lease: farm_pb2.LeaseReply, error: str, fault: Fault) -> str:
        """Report the task failed, with the error's class (worker/faults.py): the coordinator's policy."""
        request = farm_pb2.FailRequest(
            task_id=lease.task_id,
            worker_id=self.worker_id,
            fence=lease.fence,
            error=error[:defaults.ERROR_CHARS],
            retryable=fault != Fault.PERMANENT,
            fault=str(fault),
        )
        reply = self._retrying(lambda stub: stub.Fail, request)
        status = farm_pb2.TaskStatus.Name(reply.status)
        log.info("task %s reported failed (%s, %s): %s", lease.task_id, error.splitlines()[0] if error else "",
                 fault, status)
        return status

    def _retrying(self, pick: Callable[[farm_pb2_grpc.FarmWorkerStub], Callable], request: Any) -> Any:
        """Results are idempotent under the fence, so a lost reply is safe to resend: for RESULT_RETRY_S,
        following the leader (a standby that took over commits it as the old leader would have)."""
        delay, give_up = 0.5, time.monotonic() + RESULT_RETRY_S
        while True:
            address = self.address
            try:
                return pick(self.worker)(request, timeout=RPC_TIMEOUT_S, metadata=self.metadata)
            except grpc.RpcError as exc:
                if not self.coordinators.follow(exc, address) or time.monotonic() > give_up:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
