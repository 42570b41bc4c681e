"""FarmClientServicer: what `farm submit / status / watch / cancel / fetch` talk to, with the helpers
that turn the store's dicts into its replies.

Split from server.py (the size rule). Like every servicer it only translates between protobuf and
the store and maps errors to status codes; state transitions live in the Lua scripts.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from coordinator.admit.lora_check import check_render_depth, check_render_loras, shelf_folder
from coordinator.admit.media_check import check_render_media, clip_frames, store_paths
from coordinator.api.packs import PackShelf, fleet_with_shelf
from coordinator.api.watchhub import WATCH_LIMIT, WatchHub, WatchRelay, encoded_batches
from coordinator.assemble.partial import PARTIAL_FILE
from coordinator.plan.graph import SpecError
from coordinator.retention import BLOB_GRACE_S, forget_render, prune
from coordinator.scheduler import Scheduler
from coordinator.state.store import FarmStore
from coordinator.views.fleet import FleetStore
from protos import farm_pb2, farm_pb2_grpc
from protos.spec import parse_object
from protos.states import TERMINAL, Outcome, RenderState
from protos.tensors import CHUNK_BYTES

log = logging.getLogger(__name__)


OUTPUT_FILE = re.compile(r"render\.mp4|render\.json|exr/frame_\d{5}\.exr|exr/render\.json|render_hlg\.mp4|render\.m4a")
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
            "made_by",  # provenance: the worker, chip, versions and class that produced the output
            "ranks",  # a sequence-parallel gang's workers, rank 0 first: each computed a share
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
    if state == RenderState.CANCELLED:
        return f"render {render_id} was cancelled: it has no output"
    if state == RenderState.FAILED:
        return f"render {render_id} failed: it has no output ({_one_line(str(render.get('error') or '?'))})"
    return f"render {render_id} is {state}: no output yet (`farm watch {render_id}` follows it)"


def live_fleet(store: FleetStore) -> list[dict]:
    """Capabilities of the workers seen lately (a Mac that left long ago must not shape the plan)."""
    from coordinator.views.fleet import LOST_AFTER_MS
    from coordinator.views.metrics import redis_now_ms

    now = redis_now_ms(store)
    return [w.get("info") or {} for w in store.list_workers()
            if now - int(w.get("last_seen_ms") or 0) <= LOST_AFTER_MS and not w.get("refused")]


class FarmClientServicer(farm_pb2_grpc.FarmClientServicer):
    """What `farm submit / status / watch / cancel / fetch` talk to."""

    def __init__(self, store: FarmStore, scheduler: Scheduler, shelf: PackShelf | None = None,
                 watch_limit: int = WATCH_LIMIT) -> None:
        self.store = store
        self.scheduler = scheduler
        self.shelf = shelf
        # One reader of Redis for every watcher; a Watch handler only waits on its queue. The server's
        # pool holds watch_limit threads on top of the ones worker RPCs use, so Lease / Heartbeat /
        # Complete always find a thread; past the limit (or a peer's share of it) RESOURCE_EXHAUSTED.
        self.hub = WatchHub(store, encode=encoded_event)
        self.watches = WatchRelay(store, self.hub, watch_limit)

    def Submit(self, request, context):
        from coordinator.plan import render as planner
        from coordinator.plan.fleet import Fleet

        try:
            spec = parse_object(request.spec_json, "spec")  # bounded size and depth: no RecursionError
        except SpecError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._check_disk(context)
        render_id = new_render_id()
        try:
            asked = planner.normalize_spec(spec)  # the typed spec, built and checked once, where it enters
            asked = asked.resolve(**clip_frames(asked, store_paths(self.scheduler.blobs)))  # -f from the clip
            fleet = Fleet.of(fleet_with_shelf(live_fleet(self.store), self.shelf))  # workers fetch the shelf's packs
            plan = planner.validate_spec(asked, fleet)
            check_render_loras(plan, self.scheduler.blobs, self.shelf)  # uploaded, and fitting the pack
            check_render_depth(plan, shelf_folder(plan, self.shelf))  # STG blocks the DiT has
            plan = plan.resolve(**check_render_media(plan, store_paths(self.scheduler.blobs)))  # probed in a child
            self._check_room(plan)
        except (ValueError, KeyError, TypeError) as exc:  # SpecError is a ValueError
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, _one_line(f"bad spec: {exc}", exc))
        tasks = planner.plan_render(plan, render_id)
        spec = plan.as_dict()  # the stored view: the spec as asked with what the planner resolved
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
        free = self._room() + floor
        if free < floor:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"the coordinator's data folder has {free / 1e9:.1f} GB free, below its floor of "
                          f"{floor / 1e9:.1f} GB (FARM_MIN_FREE_GB): `farm prune` or free space, then submit again")

    def _check_room(self, plan) -> None:
        """A chunked render whose windows' frames would not fit the data folder above its floor: one line
        with the size, at submit (it would otherwise fail windows in, on a full disk)."""
        from coordinator.plan.chunks import chunked, held_frame_bytes

        if not chunked(plan):
            return
        need, room = held_frame_bytes(plan), self._room()
        if need > room:
            raise SpecError(f"-f {plan.frames} --chunked at {plan.width}x{plan.height}: its windows' decoded frames "
                            f"need {need / 1e9:.1f} GB in the coordinator's data folder, which has "
                            f"{max(room, 0) / 1e9:.1f} GB free above its floor: fewer frames, a smaller size, or "
                            "free space (`farm prune`)")

    def _room(self) -> int:
        """The data folder's free bytes above its floor (FARM_MIN_FREE_GB), negative below it."""
        return shutil.disk_usage(self.scheduler.data_dir).free - min_free_bytes()

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
        from coordinator.views.metrics import summarize, task_view

        render = self._render(request.render_id, context)
        tasks = self.store.render_tasks(request.render_id)
        summary = summarize(self.store, render, [task_view(t) for t in tasks])  # the farm's one ETA
        return _render_info(summary, tasks)

    def ListRenders(self, request, context):
        """The newest renders as the dashboard's list rows, so `farm status` shows the same stage and ETA."""
        from coordinator.views.metrics import list_summaries

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
        if name == PARTIAL_FILE:  # the growing film until the render is done, then the render itself
            if render.get("state") != RenderState.DONE:
                yield from self._partial(request.render_id, render, context)
                return
            name = "render.mp4"
        if not OUTPUT_FILE.fullmatch(name):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name[:80]!r} is not a render output "
                          "(render.mp4, render.json, exr/frame_NNNNN.exr, exr/render.json, render_hlg.mp4, render.m4a, partial.mp4)")
        if render.get("state") != RenderState.DONE or not output:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, _no_output(request.render_id, render))
        path = Path(output) if name == "render.mp4" else Path(output).parent / name
        if not path.is_file():
            context.abort(grpc.StatusCode.NOT_FOUND, f"render {request.render_id} has no {name} (any more)")
        with open(path, "rb") as f:
            while data := f.read(CHUNK_BYTES):
                yield farm_pb2.Chunk(data=data)

    def _partial(self, render_id: str, render: dict, context) -> Iterator[farm_pb2.Chunk]:
        """`farm fetch --partial` before the end: a chunked render's growing film (assemble/partial.py)."""
        path = Path(self.scheduler.data_dir) / "renders" / render_id / PARTIAL_FILE
        if not (render.get("spec") or {}).get("chunked"):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"render {render_id} is not --chunked: only a chunked render's film grows while it renders")
        if render.get("state") in TERMINAL:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, _no_output(render_id, render))
        if not path.is_file():
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"render {render_id} is {render.get('state')}: no window of it is finished yet")
        with open(path, "rb") as f:
            while data := f.read(CHUNK_BYTES):
                yield farm_pb2.Chunk(data=data)

    def DeleteRender(self, request, context):
        """Forget a finished render and remove what the coordinator wrote for it (its renders/ folder and
        preview); the id is one of ours (it exists in Redis), so the paths stay inside the data folder."""
        self._render(request.render_id, context)
        result = forget_render(self.store, Path(self.scheduler.data_dir), request.render_id)
        return farm_pb2.DeleteReply(deleted=result == Outcome.DELETED, state=result)

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
        from coordinator.views.metrics import redis_now_ms

        days = request.older_than_days
        if not math.isfinite(days) or days < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"older than {days} days is not a length of time")
        seconds = days * 86400
        done = prune(self.store, Path(self.scheduler.data_dir), seconds, redis_now_ms(self.store),
                     blob_grace_s=min(BLOB_GRACE_S, seconds))
        return farm_pb2.PruneReply(render_ids=done.renders, blobs=done.blobs, blob_bytes=done.blob_bytes)

    def ListWorkers(self, request, context):
        """The dashboard's worker rows (fleet.worker_view), so `farm workers` says what it says; the
        farm's clock (Redis TIME) rides in the trailing metadata for `farm doctor`'s skew check."""
        from coordinator.views.fleet import list_workers
        from coordinator.views.metrics import redis_now_ms

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
