"""The coordinator's gRPC front: thin servicers over FarmStore, Scheduler and BlobStore.

Servicers only translate between protobuf and the store's dicts and map errors to status codes;
state transitions live in the store's Lua scripts, policy in the scheduler and planner.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import secrets
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from coordinator.auth import (
    SERVER_OPTIONS,
    TOKEN_FILE,
    JoinToken,
    TokenInterceptor,
    load_or_create_token,
    read_token,
)
from coordinator.blobstore import BlobError, BlobMismatch, BlobNotFound, BlobStore, BlobTooLarge
from coordinator.dashboard import start_dashboard, stop_dashboard
from coordinator.graph import SpecError
from coordinator.guard import Guard
from coordinator.leadership import LEASE_MS as LEADER_LEASE_MS
from coordinator.leadership import LeaderGate, Leadership, lead, set_health, stand_by
from coordinator.packs import FarmPacksServicer, PackShelf, fleet_with_shelf
from coordinator.presence import Presence, TransientErrors
from coordinator.retention import BLOB_GRACE_S, forget_render, prune, start_sweeper
from coordinator.scheduler import TERMINAL_STATES, Scheduler, as_dict
from coordinator.schema import check_capabilities, check_small_object, parse_object
from coordinator.tls import load_or_create_tls
from coordinator.watchhub import WATCH_LIMIT, WatchHub, WatchRelay, encoded_batches
from protos import farm_pb2, farm_pb2_grpc
from protos.blobwire import Chunk, WireError, add_blob_service
from protos.tensors import CHUNK_BYTES

log = logging.getLogger(__name__)

STATUS = {
    "ok": farm_pb2.OK,
    "stale": farm_pb2.STALE,
    "cancel": farm_pb2.CANCEL,
    "render_ready": farm_pb2.RENDER_READY,
    "requeued": farm_pb2.REQUEUED,
    "failed": farm_pb2.FAILED,
}
MAX_WAIT_MS = 30_000
OUTPUT_FILE = re.compile(r"render\.mp4|render\.json|exr/frame_\d{5}\.exr|exr/render\.json")
DEFAULT_MIN_FREE_GB = 1.0


def min_free_bytes() -> int:
    """FARM_MIN_FREE_GB (default 1) in bytes; a value that is not a number keeps the default."""
    try:
        gigabytes = float(os.environ.get("FARM_MIN_FREE_GB", DEFAULT_MIN_FREE_GB))
    except ValueError:
        gigabytes = DEFAULT_MIN_FREE_GB
    return int(max(0.0, gigabytes) * 1e9) if math.isfinite(gigabytes) else int(DEFAULT_MIN_FREE_GB * 1e9)


def new_render_id() -> str:
    """Sortable by submit time, unique without coordination."""
    return time.strftime("r%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(3)


def _one_line(text: str, exc: BaseException | None = None) -> str:
    """SpecError messages are written for the user; keep exactly their first line."""
    if exc is not None and type(exc).__name__ == "SpecError":
        text = str(exc)
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "bad spec"


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _render_info(render: dict, tasks: list[dict] | None = None) -> farm_pb2.RenderInfo:
    record = dict(render)
    if tasks is not None:
        keep = (
            "id",
            "kind",
            "state",
            "worker",
            "attempts",
            "capability",
            "error",
            "progress",
            "inputs",
            "outputs",
            "metrics",
            "params",
            "leased_ms",
            "done_ms",
            "queued_ms",
            "max_attempts",
            "failures",  # the failure policy's record: raised failures, on which workers, leases lost
            "failed_on",
            "lost",
            "stuck_ms",
            "deps",  # the ETA's simulation (farm watch) follows the graph
        )
        record["tasks"] = [{k: t.get(k) for k in keep if k in t} for t in tasks]
    return farm_pb2.RenderInfo(
        render_id=str(render.get("id", "")),
        state=str(render.get("state") or ""),
        stage=str(render.get("stage") or ""),
        error=str(render.get("error") or ""),
        output=str(render.get("output") or ""),
        created_ms=int(render.get("created_ms") or 0),
        json=_json(record),
    )


def encoded_event(render_id: str, event_id: str, event: dict) -> bytes:
    """An Event's wire bytes: made once per event by the watch hub, whatever the number of watchers."""
    return farm_pb2.Event(id=str(event_id), render_id=render_id, json=_json(event)).SerializeToString()


FARM_NOW_MS = "farm-now-ms"


def _no_output(render_id: str, render: dict) -> str:
    state = render.get("state")
    if state == "cancelled":
        return f"render {render_id} was cancelled: it has no output"
    if state == "failed":
        return f"render {render_id} failed: it has no output ({_one_line(str(render.get('error') or '?'))})"
    return f"render {render_id} is {state}: no output yet (`farm watch {render_id}` follows it)"


def live_fleet(store: Any) -> list[dict]:
    """Capabilities of the workers seen lately (a Mac that left long ago must not shape the plan)."""
    from coordinator.metrics import LOST_AFTER_MS, redis_now_ms

    now = redis_now_ms(store)
    return [w.get("info") or {} for w in store.list_workers()
            if now - int(w.get("last_seen_ms") or 0) <= LOST_AFTER_MS]


class FarmClientServicer(farm_pb2_grpc.FarmClientServicer):
    """What `farm submit / status / watch / cancel / fetch` talk to."""

    def __init__(self, store: Any, scheduler: Scheduler, shelf: PackShelf | None = None,
                 watch_limit: int = WATCH_LIMIT) -> None:
        self.store = store
        self.scheduler = scheduler
        self.shelf = shelf
        # One reader of Redis for every watcher; a Watch handler only waits on its queue. The server's
        # pool holds watch_limit threads on top of the ones worker RPCs use, so Lease / Heartbeat /
        # Complete always find a thread; past the limit (or a peer's share of it) RESOURCE_EXHAUSTED.
        self.hub = WatchHub(store, TERMINAL_STATES, encode=encoded_event)
        self.watches = WatchRelay(store, self.hub, watch_limit)

    def Submit(self, request, context):
        from coordinator import planner

        try:
            spec = parse_object(request.spec_json, "spec")  # bounded size and depth: no RecursionError
        except SpecError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._check_disk(context)
        render_id = new_render_id()
        try:
            spec = planner.normalize_spec(spec) if hasattr(planner, "normalize_spec") else spec
            fleet = fleet_with_shelf(live_fleet(self.store), self.shelf)  # workers fetch the shelf's packs
            planner.validate_spec(spec, fleet)
        except (ValueError, KeyError, TypeError) as exc:  # SpecError is a ValueError
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, _one_line(f"bad spec: {exc}", exc))
        tasks = planner.plan_render(spec, render_id)
        missing = self._missing_blobs(tasks)
        if missing:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"spec names blob {missing[:12]} that was never uploaded"
            )
        self.store.create_render(render_id, spec, tasks, priority=int(spec.get("priority", 0) or 0))
        self.scheduler.wake()
        log.info("render %s queued with %d tasks", render_id, len(tasks))
        return farm_pb2.SubmitReply(render_id=render_id)

    def _check_disk(self, context) -> None:
        """Below the free-space floor of the data folder (FARM_MIN_FREE_GB, default 1) nothing is queued:
        a render that cannot write its blobs and mp4 would fail late, and take the farm's Redis along."""
        floor = min_free_bytes()
        free = shutil.disk_usage(self.scheduler.data_dir).free
        if free < floor:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"the coordinator's data folder has {free / 1e9:.1f} GB free, below its floor of "
                          f"{floor / 1e9:.1f} GB (FARM_MIN_FREE_GB): `farm prune` or free space, then submit again")

    def _missing_blobs(self, tasks: list[dict]) -> str | None:
        """The first {"blob": sha} input that is not in the blob store (so it fails at submit, not on a Mac)."""
        for task in tasks:
            for ref in (task.get("inputs") or {}).values():
                if isinstance(ref, dict) and "blob" in ref and not self.scheduler.blobs.has(str(ref["blob"])):
                    return str(ref["blob"])
        return None

    def _render(self, render_id: str, context) -> dict:
        render = self.store.get_render(render_id)
        if render is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no render {render_id}")
        return render

    def GetRender(self, request, context):
        """The render with its tasks and the dashboard's summary (prompt, current stage, progress, ETA)."""
        from coordinator.metrics import (
            kind_speeds,
            live_slots,
            live_worker_count,
            redis_now_ms,
            render_summary,
            task_view,
        )

        render = self._render(request.render_id, context)
        tasks = self.store.render_tasks(request.render_id)
        views, now = [task_view(t) for t in tasks], redis_now_ms(self.store)
        summary = render_summary(render, views, now, kind_speeds(self.store, {v["kind"] for v in views}),
                                 live_worker_count(self.store, now), live_slots(self.store, now))
        return _render_info(summary, tasks)

    def ListRenders(self, request, context):
        """The newest renders as the dashboard's list rows, so `farm status` shows the same stage and ETA."""
        from coordinator.metrics import list_summaries

        return farm_pb2.RenderList(renders=[_render_info(r) for r in list_summaries(self.store, request.limit or 50)])

    def Watch(self, request, context) -> Iterator[bytes]:
        """Relay the render's event stream, one Event per message (WatchBatches sends them together)."""
        for delivery in self.watches.deliveries(request, context, self._render):
            yield from delivery

    def WatchBatches(self, request, context) -> Iterator[bytes]:
        """The same stream, the events of each delivery in one EventBatch: one send per watcher per
        delivery, which is what lets a crowd of watchers leave worker RPCs alone."""
        for delivery in self.watches.deliveries(request, context, self._render):
            yield from encoded_batches(delivery)

    def Cancel(self, request, context):
        self._render(request.render_id, context)
        return farm_pb2.CancelReply(cancelled=bool(self.store.cancel_render(request.render_id)))

    def FetchOutput(self, request, context) -> Iterator[farm_pb2.Chunk]:
        """A file of a finished render's folder, named by one of the coordinator's own names (the mp4,
        its metadata, EXR frames): nothing in the request becomes a path."""
        render = self._render(request.render_id, context)
        output = render.get("output")
        name = request.file or "render.mp4"
        if not OUTPUT_FILE.fullmatch(name):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name[:80]!r} is not a render output "
                          "(render.mp4, render.json, exr/frame_NNNNN.exr, exr/render.json)")
        if render.get("state") != "done" or not output:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, _no_output(request.render_id, render))
        path = Path(output) if name == "render.mp4" else Path(output).parent / name
        if not path.is_file():
            context.abort(grpc.StatusCode.NOT_FOUND, f"render {request.render_id} has no {name} (any more)")
        with open(path, "rb") as f:
            while data := f.read(CHUNK_BYTES):
                yield farm_pb2.Chunk(data=data)

    def DeleteRender(self, request, context):
        """Forget a finished render and remove what the coordinator wrote for it (its renders/ folder and
        preview); the id is one of ours (it exists in Redis), so the paths stay inside the data folder."""
        self._render(request.render_id, context)
        result = forget_render(self.store, Path(self.scheduler.data_dir), request.render_id)
        return farm_pb2.DeleteReply(deleted=result == "deleted", state=result)

    def RetryRender(self, request, context):
        """`farm retry`: a failed or cancelled render runs again under its id, only its unfinished tasks
        (retry_render.lua); the outcome says why not otherwise, and the client then submits it anew."""
        self._render(request.render_id, context)
        outcome = self.store.retry_render(request.render_id)
        self.scheduler.wake()
        return farm_pb2.RetryReply(outcome=outcome)

    def Prune(self, request, context):
        """`farm prune --older-than DAYS`: what the hourly sweep does, now and with the operator's cutoff
        (blobs younger than the cutoff, or an hour, stay: an upload may be on its way to a submit)."""
        from coordinator.metrics import redis_now_ms

        days = request.older_than_days
        if not math.isfinite(days) or days < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"older than {days} days is not a length of time")
        seconds = days * 86400
        done = prune(self.store, Path(self.scheduler.data_dir), seconds, redis_now_ms(self.store),
                     blob_grace_s=min(BLOB_GRACE_S, seconds))
        return farm_pb2.PruneReply(render_ids=done.renders, blobs=done.blobs, blob_bytes=done.blob_bytes)

    def ListWorkers(self, request, context):
        """The dashboard's worker rows (metrics.worker_view), so `farm workers` says what it says; the
        farm's clock (Redis TIME) rides in the trailing metadata for `farm doctor`'s skew check."""
        from coordinator.metrics import list_workers, redis_now_ms

        context.set_trailing_metadata(((FARM_NOW_MS, str(redis_now_ms(self.store))),))
        rows = [farm_pb2.WorkerStatus(worker_id=str(w["id"]), state=w["state"], current_task=w["current_task"],
                                      json=_json(w)) for w in list_workers(self.store)]
        return farm_pb2.WorkerList(workers=rows)

    def DrainWorker(self, request, context):
        return farm_pb2.DrainReply(found=self.store.drain_worker(request.worker_id))

    def Requeue(self, request, context):
        """Clear the render's blocklist; with a task id, also take that task from its worker."""
        self._render(request.render_id, context)
        requeued = bool(request.task_id) and self.store.requeue_task(request.task_id)
        cleared = self.store.clear_blocklist(request.render_id)
        self.scheduler.wake()
        return farm_pb2.RequeueReply(cleared=cleared, requeued=requeued)


class FarmWorkerServicer(farm_pb2_grpc.FarmWorkerServicer):
    """The worker protocol: register, lease (long poll), heartbeat, complete, fail."""

    def __init__(self, store: Any, scheduler: Scheduler, presence: Presence | None = None) -> None:
        self.store = store
        self.scheduler = scheduler
        self.presence = presence or Presence(store, scheduler.wake)

    def Attach(self, request, context):
        yield from self.presence.attach(request, context)

    def Register(self, request, context):
        if not request.worker_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "worker_id is required")
        try:
            info = check_capabilities(request.capabilities_json)  # typed where the planner reads it
        except SpecError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        info.setdefault("peer", context.peer())
        self.store.register_worker(request.worker_id, info, resumed=request.resumed, session=request.session,
                                   idle=request.idle)
        lease_ms = self.scheduler.lease_ms
        return farm_pb2.RegisterReply(lease_ms=lease_ms, heartbeat_ms=max(1, lease_ms // 3))

    def Lease(self, request, context):
        return self._lease(request.worker_id, request, min(max(0, request.wait_ms), MAX_WAIT_MS), context)

    def _lease(self, wid: str, request, wait_ms: int, context) -> farm_pb2.LeaseReply:
        """One Lua call per poll (it marks the worker seen); a draining worker is told so at once."""
        task = self.scheduler.lease(wid, list(request.capabilities), wait_ms,
                                    lambda: context.is_active() and not self.store.worker_draining(wid))
        if task is None:
            if self.store.worker_draining(wid):  # drained (lease.lua marked it): the worker exits on this reply
                return farm_pb2.LeaseReply(has_task=False, drain=True)
            return farm_pb2.LeaseReply(has_task=False)
        if not context.is_active():  # the worker left while its lease was granted: give it back now
            self.store.lose_leases(wid, "", "the lease reply found no worker", str(task["id"]))
            self.scheduler.wake()
            return farm_pb2.LeaseReply(has_task=False)
        return farm_pb2.LeaseReply(
            has_task=True,
            task_id=str(task["id"]),
            render_id=str(task.get("render") or ""),
            kind=str(task.get("kind") or ""),
            params_json=_json(as_dict(task.get("params"))),
            inputs={str(k): str(v) for k, v in as_dict(task.get("inputs")).items()},
            fence=int(task["fence"]),
            attempts=int(task.get("attempts") or 0),
            lease_ms=self.scheduler.lease_ms,
        )

    def Heartbeat(self, request, context):
        progress = check_small_object(request.progress_json, "progress_json") if request.progress_json else None
        status, drain = self.store.beat(  # one Lua call: the lease, the worker's liveness, its drain mark
            request.task_id, request.worker_id, request.fence, self.scheduler.lease_ms, progress
        )
        return farm_pb2.StatusReply(status=STATUS[status], drain=drain)

    def Complete(self, request, context):
        metrics = check_small_object(request.metrics_json, "metrics_json") if request.metrics_json else {}
        status, message = self.scheduler.complete(
            request.task_id, request.worker_id, request.fence, dict(request.outputs), metrics
        )
        reply = farm_pb2.StatusReply(status=STATUS[status], message=message)
        if request.HasField("next"):  # the next lease rides on this call (no waiting: the worker long-polls)
            reply.next.CopyFrom(self._lease(request.worker_id, request.next, 0, context))
        return reply

    def Fail(self, request, context):
        status = self.store.fail(
            request.task_id,
            request.worker_id,
            request.fence,
            request.error[:4000],
            retryable=request.retryable,
            seen=True,
        )
        self.scheduler.wake()
        return farm_pb2.StatusReply(status=STATUS[status])


class FarmBlobsServicer:
    """Content-addressed blob upload/download, verified on arrival; served with protos.blobwire's codec
    (chunks as views, hashed while they stream)."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs

    def PutBlob(self, chunks: Iterator[Chunk], context) -> tuple[str, int]:
        try:
            return self.blobs.put_chunks(chunks)
        except BlobMismatch as exc:
            context.abort(grpc.StatusCode.DATA_LOSS, str(exc))
        except BlobTooLarge as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except (BlobError, WireError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    def GetBlob(self, sha: str, context) -> Iterator[Chunk]:
        try:
            chunks = self.blobs.wire_chunks(sha)
        except BlobNotFound:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no blob {sha}")
        except BlobError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        yield from chunks


def serve(
    store: Any,
    data_dir: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    *,
    lease_ms: int = 30_000,
    max_workers: int = 256,  # every worker holds a Lease long poll and an Attach stream
    watch_limit: int = WATCH_LIMIT,  # Watch streams, served by threads of their own on top of max_workers
    expiry_interval_s: float = 1.0,
    packs_dir: Path | None = None,
    advertise: str | None = None,
    leader_lease_ms: int = LEADER_LEASE_MS,
) -> tuple[grpc.Server, int]:
    """Start the coordinator's gRPC server; returns (server, bound port). Call stop(server) to end.
    It serves the farm while it holds the leadership lease, and stands by (answering UNAVAILABLE with
    the leader's address) while another coordinator does; `advertise` is the address it gives out."""
    data_dir = Path(data_dir)
    token = token or load_or_create_token(data_dir)
    blobs = BlobStore(data_dir, store)
    scheduler = Scheduler(store, blobs, data_dir, lease_ms=lease_ms, expiry_interval_s=expiry_interval_s)
    health_servicer = health.HealthServicer()
    leadership = Leadership(store, "", lambda: lead(server), lambda: stand_by(server), leader_lease_ms)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers + watch_limit, thread_name_prefix="farm-rpc"),
        interceptors=[TokenInterceptor(token, _token_file(data_dir, token)), LeaderGate(leadership), Guard(),
                      TransientErrors()],
        options=SERVER_OPTIONS,
    )
    shelf = PackShelf(Path(packs_dir) if packs_dir else data_dir / "packs")  # packs workers copy from here
    threading.Thread(target=shelf.warm, name="pack-hashes", daemon=True).start()
    client_servicer = FarmClientServicer(store, scheduler, shelf, watch_limit=watch_limit)
    farm_pb2_grpc.add_FarmClientServicer_to_server(client_servicer, server)
    server.farm_watch_hub = client_servicer.hub  # type: ignore[attr-defined]
    farm_pb2_grpc.add_FarmPacksServicer_to_server(FarmPacksServicer(shelf, store), server)
    presence = Presence(store, scheduler.wake, leadership.is_serving)
    farm_pb2_grpc.add_FarmWorkerServicer_to_server(FarmWorkerServicer(store, scheduler, presence), server)
    blob_servicer = FarmBlobsServicer(blobs)
    add_blob_service(server, blob_servicer.PutBlob, blob_servicer.GetBlob)
    set_health(health_servicer, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = _bind(server, data_dir, host, port)
    if bound == 0:
        raise OSError(f"could not bind {host}:{port}")
    leadership.address = advertise or f"{socket.gethostname() if host in ('0.0.0.0', '::', '') else host}:{bound}"
    server.farm_scheduler = scheduler  # type: ignore[attr-defined]
    server.farm_health = health_servicer  # type: ignore[attr-defined]
    server.farm_leadership = leadership  # type: ignore[attr-defined]
    server.farm_presence = presence  # type: ignore[attr-defined]
    server.farm_reducer = None  # type: ignore[attr-defined]
    server.farm_fleet = lambda: fleet_with_shelf(live_fleet(store), shelf)  # type: ignore[attr-defined]
    server.start()
    leadership.claim_once()  # a lone coordinator leads before serve() returns
    leadership.start()
    server.farm_retention_stop = threading.Event()  # type: ignore[attr-defined]
    start_sweeper(store, data_dir, leadership.is_serving, lambda: _redis_now_ms(store), server.farm_retention_stop)
    log.info("coordinator listening on %s:%d (%s)", host, bound, "leading" if leadership.leading else "standby")
    return server, bound


def _token_file(data_dir: Path, token: str) -> Path | None:
    """DATA/token when it is where this token came from: the server follows it (`farm token rotate`)."""
    path = data_dir / TOKEN_FILE
    try:
        return path if JoinToken.parse(read_token(path)).secret == JoinToken.parse(token).secret else None
    except (OSError, ValueError):
        return None


def _redis_now_ms(store: Any) -> int:
    from coordinator.metrics import redis_now_ms

    return redis_now_ms(store)


def _bind(server: grpc.Server, data_dir: Path, host: str, port: int) -> int:
    """TLS with the farm's certificate (DATA/tls, made on first start); there is no plaintext port."""
    tls = load_or_create_tls(data_dir)
    credentials = grpc.ssl_server_credentials([(tls.server_key_pem, tls.chain_pem)])
    return server.add_secure_port(f"{host}:{port}", credentials)


def stop(server: grpc.Server, grace: float = 2.0) -> None:
    """Stop accepting RPCs, let in-flight ones finish, stop the loops, then hand the lease back so a
    standby takes over at once."""
    presence = getattr(server, "farm_presence", None)
    if presence is not None:
        presence.stopping.set()  # streams our shutdown breaks blame no worker
    leadership = getattr(server, "farm_leadership", None)
    if leadership is not None:
        leadership.halt()
    health_servicer = getattr(server, "farm_health", None)
    if health_servicer is not None:
        health_servicer.enter_graceful_shutdown()
    server.stop(grace).wait()
    hub = getattr(server, "farm_watch_hub", None)
    if hub is not None:
        hub.stop()
    reducer = getattr(server, "farm_reducer", None)
    if reducer is not None:
        reducer.stop()
    retention_stop = getattr(server, "farm_retention_stop", None)
    if retention_stop is not None:
        retention_stop.set()
    scheduler = getattr(server, "farm_scheduler", None)
    if scheduler is not None:
        scheduler.stop()
    if leadership is not None:
        leadership.release()


def run_coordinator(
    data_dir: Path, host: str, port: int, redis_url: str | None = None, prefix: str = "farm",
    packs_dir: Path | None = None,
    dashboard_host: str = "127.0.0.1", dashboard_port: int = 8470, advertise: str | None = None,
) -> int:
    """Run until SIGTERM/SIGINT: embedded Redis (unless redis_url), store, server. Coordinators sharing
    one Redis (and one data folder, for the blobs) elect a leader; the others stand by."""
    from contextlib import ExitStack

    from coordinator import redis_server
    from coordinator.store import FarmStore
    from protos.logsetup import log_path, setup_logging

    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(log_path(data_dir, "coordinator"))  # named by `farm doctor`
    with ExitStack() as stack:
        if redis_url is None:
            redis_url = stack.enter_context(redis_server.EmbeddedRedis(data_dir / "redis")).url
        store = FarmStore(redis_server.connect(redis_url), prefix)
        token = load_or_create_token(data_dir)
        server, bound = serve(store, data_dir, host, port, token, packs_dir=packs_dir, advertise=advertise)
        dashboard, dash_port = start_dashboard(store, dashboard_host, dashboard_port, token, data_dir=data_dir,
                                               token_file=_token_file(data_dir, token))  # follows a rotate
        stack.callback(stop_dashboard, dashboard)
        print(f"coordinator on {host}:{bound}; dashboard http://{dashboard_host}:{dash_port}/; "
              f"token in {data_dir / 'token'}", flush=True)
        done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        done.wait()
        stop(server)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="farm coordinator", description="Run the LTX farm coordinator.")
    parser.add_argument("--data-dir", type=Path, default=Path("farm-data"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50551)
    parser.add_argument("--redis-url", default=None, help="use this Redis instead of the embedded one")
    parser.add_argument("--packs-dir", type=Path, default=None, help="packs workers copy (default DATA/packs)")
    parser.add_argument("--advertise", default=None, help="HOST:PORT a standby sends workers and clients to")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_coordinator(args.data_dir, args.host, args.port, args.redis_url, packs_dir=args.packs_dir, advertise=args.advertise)


if __name__ == "__main__":
    raise SystemExit(main())
