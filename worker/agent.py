"""`farm worker`: the agent on each Mac. It pulls tasks; it never talks to Redis.

Loop: register (capabilities from Runner.capabilities()) -> long-poll Lease -> fetch inputs
(verified, cached by sha256) -> Runner.run with a heartbeat thread reporting step progress ->
upload outputs -> Complete with the lease's fence. A heartbeat answer of CANCEL or STALE stops the
run: the work is discarded and reported, never committed. When the coordinator is away the agent
backs off and re-registers; SIGTERM/SIGINT stop it cleanly (a running task is handed back).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from protos import farm_pb2, farm_pb2_grpc
from protos.auth import NO_TOKEN, TOKEN_ON_ARGV, TokenError, auth_metadata, read_token, resolve_token
from protos.blobwire import BlobStub, WireError, receive_into_buffer
from protos.retry import GaveUp, retry
from protos.tensors import MAGIC, decode_tensor, encode_tensor
from worker.blobcache import BlobCache
from worker.connection import Coordinators, default_worker_id, request_drain
from worker.packsync import PackSync
from worker.presence import Presence
from worker.tasklog import TaskLog

log = logging.getLogger("farm.worker")

RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
RPC_TIMEOUT_S = 30.0
TRANSFER_TIMEOUT_S = 1800.0
RECONNECT_MAX_S = 2.0  # the agent's own retry backoff cap (grpc's reconnect backoff is capped alike)
RESULT_RETRY_S = 60.0  # how long a finished result is offered (across a coordinator failover)
UPLOAD_RETRY_S = 30.0  # how long a finished result's upload is retried before the task is reported failed
UPLOAD_AGAIN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.DATA_LOSS, grpc.StatusCode.INTERNAL, grpc.StatusCode.ABORTED)
FETCH_THREADS = 4  # a task's inputs fetched at once
STOP_GRACE_S = 1.0  # on stop, how long an in-flight Lease reply may take to land
DEFAULT_CAPABILITIES = ("mlx",)


class TransferError(Exception):
    """A result could not be uploaded within UPLOAD_RETRY_S: reported as the task's failure."""


class StopRun(Exception):
    """Raised inside progress() to unwind a run the coordinator no longer wants."""


def lease_capabilities(caps: dict) -> list[str]:
    """Ready queues this worker serves: the runner's explicit list, else the MLX queue (graph.CAPABILITY)."""
    explicit = caps.get("capabilities")
    if isinstance(explicit, list) and explicit:
        return [str(c) for c in explicit]
    return list(DEFAULT_CAPABILITIES)


def load_runner(packs_dir: Path | None, throttle: float = 1.0) -> Any:
    """The real worker.runner.Runner over packs_dir (imported late: it loads MLX)."""
    from worker.runner import Runner

    return Runner(packs_dir, throttle=throttle)


class _Heartbeat(threading.Thread):
    """Extends the lease every heartbeat_ms and carries progress; flags cancel/stale."""

    def __init__(self, agent: Agent, lease: farm_pb2.LeaseReply, interval_s: float) -> None:
        super().__init__(name=f"heartbeat-{lease.task_id}", daemon=True)
        self.agent, self.lease, self.interval_s = agent, lease, interval_s
        self.progress: dict = {}
        self.stop_reason: str | None = None
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval_s):
            request = farm_pb2.HeartbeatRequest(
                task_id=self.lease.task_id,
                worker_id=self.agent.worker_id,
                fence=self.lease.fence,
                progress_json=json.dumps(self.progress),
            )
            address = self.agent.address
            try:
                reply = self.agent.worker.Heartbeat(
                    request, timeout=RPC_TIMEOUT_S, metadata=self.agent.metadata
                )
            except grpc.RpcError as exc:  # coordinator away: keep working, the next beat may land
                log.warning("heartbeat for %s failed: %s", self.lease.task_id, exc.code())
                self.agent.coordinators.follow(exc, address)  # a standby named the leader: beat there
                continue
            if reply.drain:
                self.agent.drain(by_coordinator=True)
            else:
                self.agent.resume()  # the drain mark was lifted (the dashboard's resume) before we left
            if reply.status in (farm_pb2.CANCEL, farm_pb2.STALE):
                self.stop_reason = "cancelled" if reply.status == farm_pb2.CANCEL else "lease lost (stale)"
                log.info("task %s: %s", self.lease.task_id, self.stop_reason)
                return

    def finish(self) -> None:
        self._done.set()
        self.join(5)


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
        self.metadata = list(auth_metadata(token))  # one list: Presence and PackSync see a new token too
        self.token_file = token_file  # read again when the coordinator refuses us (`farm token rotate`)
        self.wait_ms = wait_ms
        self.cache = BlobCache(cache_dir or Path.home() / ".cache" / "ltx-farm" / "blobs")
        self.channel = self.coordinators.channel()
        self.stopping = threading.Event()
        self.draining = threading.Event()  # finish the current task, take no more, exit
        self._drain_lifts_with_mark = False  # a coordinator's drain, which its resume undoes
        self._registered_once = False
        self.capabilities: dict = {}
        self.heartbeat_ms = 10_000
        self.tasks_done = 0
        self.next_lease: farm_pb2.LeaseReply | None = None  # leased in the last Complete's reply
        self.session = secrets.token_hex(8)  # this process: a new one tells the farm the last one is gone
        self.presence = Presence(lambda: self.worker, self.worker_id, self.session, self.metadata)
        packs_dir = getattr(runner, "packs_dir", None)  # packs it lacks are copied here from the coordinator
        self.packsync = PackSync(self.coordinators.channel, self.metadata, self.worker_id, packs_dir,
                                 pack_max_bytes_per_s) if packs_dir else None

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
                if self._packs_arrived():
                    registered = False  # register again: the new pack is in our capabilities
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    if self._reload_token():
                        registered = False
                        continue
                    log.error("coordinator refused our token; check --token-file / FARM_TOKEN")
                    return 2
                if exc.code() not in RETRY_CODES and exc.code() != grpc.StatusCode.CANCELLED:
                    log.error("coordinator error %s: %s", exc.code(), exc.details())
                else:
                    log.warning("coordinator at %s unreachable; retrying in %.1fs", address, backoff)
                self.coordinators.follow(exc, address)
                registered = False
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)
        if self.next_lease is not None:  # leased with the last result, never started: hand it back
            self._report_fail(self.next_lease, "worker shutting down", retryable=True)
        if self.draining.is_set():
            log.info("drained: exiting")
        self.presence.stop()
        self.coordinators.close()
        return 0

    def register(self) -> None:
        self.capabilities = dict(self.runner.capabilities())
        request = farm_pb2.WorkerInfo(
            worker_id=self.worker_id, capabilities_json=json.dumps(self.capabilities), resumed=self._registered_once,
            # registered between tasks only: a lease the farm has for us was never received (unless it
            # came with the last result and is about to run)
            idle=self.next_lease is None,
            session=self.session,
        )
        reply = self.worker.Register(request, timeout=RPC_TIMEOUT_S, metadata=self.metadata)
        self._registered_once = True
        self.heartbeat_ms = int(reply.heartbeat_ms) or max(1, int(reply.lease_ms) // 3)
        if not self.presence.is_alive():
            self.presence.start()  # the Attach stream: our death is noticed from it at once
        log.info("registered %s with %s (heartbeat %d ms)", self.worker_id, self.address, self.heartbeat_ms)

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
            self._report_fail(reply, "worker shutting down", retryable=True)
            return None
        return reply

    # ------------------------------------------------------------------ one task

    def run_task(self, lease: farm_pb2.LeaseReply, lease_next: bool = False) -> str:
        """Run one leased task to a reported end. Returns the coordinator's final status name. lease_next:
        the Complete call asks for the next task too (kept in self.next_lease): one RPC per task."""
        tasklog = TaskLog.start()  # this task's log lines travel with its result (`farm logs`)
        log.info("task %s (%s) of %s, attempt %d", lease.task_id, lease.kind, lease.render_id, lease.attempts)
        beat = _Heartbeat(self, lease, self.heartbeat_ms / 1000.0)
        beat.start()

        def progress(step: int, total: int) -> None:
            beat.progress = {"step": int(step), "total": int(total)}

        def cancelled() -> bool:
            return beat.stop_reason is not None or self.stopping.is_set()

        try:
            if self.packsync is not None:  # a pack only the coordinator holds: copy it before running
                self.packsync.ensure(str(json.loads(lease.params_json or "{}").get("pack") or ""))
            start = time.perf_counter()
            inputs = self.fetch_inputs(dict(lease.inputs))
            fetched = time.perf_counter()
            beat.progress = {"phase": "run"}  # the next beat tells the dashboard: computing, not fetching
            outputs, metrics = self.runner.run(
                lease.kind, json.loads(lease.params_json or "{}"), inputs, progress, cancelled
            )
            if cancelled():
                return self._report_fail(lease, self._stop_reason(beat), retryable=True)
            ran = time.perf_counter()
            encoded = {name: encode_tensor(np.asarray(arr)) for name, arr in outputs.items()}
            shas = self._upload(encoded)
            metrics.update(  # what the task cost beyond its compute: moving its tensors
                fetch_s=round(fetched - start, 4), upload_s=round(time.perf_counter() - ran, 4),
                bytes_in=int(sum(a.nbytes for a in inputs.values())),
                bytes_out=int(sum(len(d) for d in encoded.values())), log=tasklog.lines(),
            )
            request = farm_pb2.CompleteRequest(
                task_id=lease.task_id,
                worker_id=self.worker_id,
                fence=lease.fence,
                outputs=shas,
                metrics_json=json.dumps(metrics, default=float),
            )
            if lease_next and not (self.stopping.is_set() or self.draining.is_set()):
                request.next.CopyFrom(farm_pb2.LeaseRequest(
                    worker_id=self.worker_id, capabilities=lease_capabilities(self.capabilities)))
            reply = self._retrying(lambda stub: stub.Complete, request)
            self._keep_next(reply)
            status = farm_pb2.TaskStatus.Name(reply.status)
            if reply.message:
                log.warning("task %s result refused: %s", lease.task_id, reply.message)
            log.info("task %s: %s", lease.task_id, status)
            return status
        except grpc.RpcError as exc:
            if exc.code() in RETRY_CODES or exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise  # coordinator away: the run loop backs off; the lease expires and is re-queued
            return self._report_fail(lease, f"coordinator refused: {exc.code().name}: {exc.details()}", True)
        except Exception as exc:
            if cancelled():
                return self._report_fail(lease, self._stop_reason(beat), retryable=True)
            log.exception("task %s failed", lease.task_id)
            error = f"{type(exc).__name__}: {exc}"
            return self._report_fail(lease, error, retryable=bool(getattr(exc, "retryable", True)))
        finally:
            beat.finish()
            tasklog.stop()

    def _keep_next(self, reply: farm_pb2.StatusReply) -> None:
        """The lease that came with a result: run next (or handed back when we stop meanwhile)."""
        if not reply.HasField("next"):
            return
        if reply.next.drain:
            self.drain()
        if reply.next.has_task:
            self.next_lease = reply.next

    def _stop_reason(self, beat: _Heartbeat) -> str:
        return beat.stop_reason or "worker shutting down"

    def _report_fail(self, lease: farm_pb2.LeaseReply, error: str, retryable: bool) -> str:
        request = farm_pb2.FailRequest(
            task_id=lease.task_id,
            worker_id=self.worker_id,
            fence=lease.fence,
            error=error[:4000],
            retryable=retryable,
        )
        reply = self._retrying(lambda stub: stub.Fail, request)
        status = farm_pb2.TaskStatus.Name(reply.status)
        log.info(
            "task %s reported failed (%s): %s", lease.task_id, error.splitlines()[0] if error else "", status
        )
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

    # ------------------------------------------------------------------ blobs

    def fetch_blob(self, sha: str) -> bytes | bytearray:
        """From the local cache, else streamed from the coordinator: hashed and written to the cache
        as it arrives, kept only when it verifies."""
        data = self.cache.get(sha)
        if data is not None:
            return data

        used = [""]  # the address the last attempt went to

        def get() -> bytearray:
            used[0] = self.address
            stub = BlobStub(self.coordinators.channel(used[0]))
            with self.cache.writer(sha) as keep:
                return receive_into_buffer(stub.get(sha, TRANSFER_TIMEOUT_S, self.metadata), sha, keep)

        def away(exc: BaseException) -> bool:
            return isinstance(exc, grpc.RpcError) and self.coordinators.follow(exc, used[0])

        # A coordinator that dies mid-fetch: fetch again from the leader (a standby taking over, or the
        # same one restarted) while the heartbeat keeps the lease, instead of dropping the task.
        try:
            return retry(get, f"fetch of blob {sha[:12]}", transient=away, log=log, stop=self.stopping,
                         give_up_s=RESULT_RETRY_S, max_delay_s=RECONNECT_MAX_S)
        except WireError as exc:
            raise OSError(str(exc)) from None

    def fetch_inputs(self, shas: dict[str, str]) -> dict[str, np.ndarray]:
        """A task's inputs fetched side by side: each is a round trip or more (a tile has a handful), so
        their latencies overlap instead of adding up. A sha named twice is fetched once."""
        unique = sorted(set(shas.values()))
        if len(unique) <= 1:
            got = {sha: self.fetch_input(sha) for sha in unique}
        else:
            with ThreadPoolExecutor(max_workers=min(FETCH_THREADS, len(unique)), thread_name_prefix="fetch") as pool:
                got = dict(zip(unique, pool.map(self.fetch_input, unique), strict=True))
        return {name: got[sha] for name, sha in shas.items()}

    def fetch_input(self, sha: str) -> np.ndarray:
        data = self.fetch_blob(sha)
        if data[: len(MAGIC)] == MAGIC:
            return decode_tensor(data)
        return np.frombuffer(data, dtype=np.uint8)  # raw file inputs (e.g. a conditioning image)

    def _upload(self, encoded: dict[str, bytes]) -> dict[str, str]:
        """Each output uploaded, retried through an outage or a corrupted transfer for UPLOAD_RETRY_S;
        then TransferError, which the task reports as its failure (not a silent lease expiry)."""

        def again(exc: BaseException) -> bool:
            if not isinstance(exc, grpc.RpcError):
                return False
            return self.coordinators.follow(exc, self.address) or exc.code() in UPLOAD_AGAIN

        shas = {}
        for name, data in encoded.items():
            try:
                shas[name] = retry(lambda d=data: self.put_blob(d), f"upload of output {name}", transient=again,
                                   log=log, stop=self.stopping, give_up_s=UPLOAD_RETRY_S, max_delay_s=RECONNECT_MAX_S)
            except GaveUp as exc:
                raise TransferError(f"upload failed: {exc}") from exc
        return shas

    def put_blob(self, data: bytes | bytearray | memoryview) -> str:
        """Streamed as views of data, hashed on the way; the coordinator verifies before keeping it."""
        return BlobStub(self.coordinators.channel(self.address)).put(data, TRANSFER_TIMEOUT_S, self.metadata)


def worker_token(token_file: Path | None) -> str:
    """--token-file, else FARM_TOKEN, FARM_TOKEN_FILE or the macOS keychain (protos.auth.resolve_token);
    one line naming them when none has a token. Never the command line, which `ps` shows."""
    try:
        token = resolve_token(token_file)
    except TokenError as exc:
        raise SystemExit(f"farm worker: {exc}") from None
    if not token:
        raise SystemExit(f"farm worker: {NO_TOKEN}")
    return token


def run_worker(coordinator: str, token: str, packs_dir: Path | None = None, worker_id: str | None = None,
               cache_dir: Path | None = None, wait_ms: int = 10_000, max_tasks: int | None = None,
               pack_max_mbps: float | None = None, drain: bool = False, log_file: Path | None = None,
               throttle: float = 1.0, token_file: Path | None = None) -> int:
    """Run this Mac's worker until stopped (or, with drain, ask the running one to finish and exit): what
    `farm worker` and `python -m worker.agent` both call. Logs go to stderr and log_file when given."""
    from protos.logsetup import setup_logging

    setup_logging(log_file)
    if drain:
        return request_drain(coordinator, token, worker_id or default_worker_id())
    agent = Agent(coordinator, token, load_runner(packs_dir, throttle), worker_id=worker_id, cache_dir=cache_dir,
                  wait_ms=wait_ms, pack_max_bytes_per_s=pack_max_mbps * 1e6 if pack_max_mbps else None,
                  token_file=token_file)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    signal.signal(signal.SIGUSR1, lambda *_: agent.drain())
    return agent.run(max_tasks=max_tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="farm worker", description="Run a farm worker on this Mac.")
    parser.add_argument("--coordinator", default=os.environ.get("FARM_COORDINATOR"),
                        help="HOST:PORT of the coordinator, or a comma-separated list (leader + standbys)")
    parser.add_argument("--token", default=None, help=argparse.SUPPRESS)  # refused: `ps` would show it
    parser.add_argument("--token-file", type=Path, default=None)
    parser.add_argument("--worker-id", default=None)
    parser.add_argument("--packs-dir", type=Path, default=None)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--wait-ms", type=int, default=10_000)
    parser.add_argument("--max-tasks", type=int, default=None)
    parser.add_argument("--pack-max-mbps", type=float, default=None,
                        help="cap copying packs from the coordinator at this many MB/s (default: no cap)")
    parser.add_argument("--throttle", type=float, default=1.0,
                        help="run each task FACTOR times as long as its compute (>= 1): share this Mac with people")
    parser.add_argument("--drain", action="store_true",
                        help="ask the running worker with this id to finish its task, take no more and exit")
    args = parser.parse_args(argv)
    if args.token is not None:
        parser.exit(2, f"farm worker: {TOKEN_ON_ARGV}\n")
    if not args.coordinator:
        parser.error("give --coordinator HOST:PORT[,HOST:PORT...] or FARM_COORDINATOR")
    return run_worker(args.coordinator, worker_token(args.token_file), args.packs_dir, args.worker_id,
                      args.cache_dir, args.wait_ms, args.max_tasks, args.pack_max_mbps, args.drain,
                      throttle=args.throttle, token_file=args.token_file)


if __name__ == "__main__":
    raise SystemExit(main())
