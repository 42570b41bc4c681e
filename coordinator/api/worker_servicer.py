"""FarmWorkerServicer: the worker protocol (register, lease long poll, heartbeat, complete, fail).

Split from server.py (the size rule); thin over FarmStore and the Scheduler like the other servicers.
"""

from __future__ import annotations

import json

import grpc

from coordinator.api.presence import Presence
from coordinator.gang import handout
from coordinator.plan.graph import SpecError
from coordinator.scheduler import Scheduler, as_dict
from coordinator.schema import check_capabilities, check_progress, check_small_object
from coordinator.state.store import FarmStore
from coordinator.views.upcoming import UpcomingGuesses
from protos import defaults, farm_pb2, farm_pb2_grpc, installed
from protos.states import Fault, Outcome

STATUS = {
    Outcome.OK: farm_pb2.OK,
    Outcome.STALE: farm_pb2.STALE,
    Outcome.CANCEL: farm_pb2.CANCEL,
    Outcome.RENDER_READY: farm_pb2.RENDER_READY,
    Outcome.REQUEUED: farm_pb2.REQUEUED,
    Outcome.FAILED: farm_pb2.FAILED,
}
MAX_WAIT_MS = 30_000
MAX_CAPABILITIES, MAX_CAPABILITY_CHARS = 16, 64  # an Upcoming question reads at most this many queues


def version_refusal(worker_id: str, info: dict, ours: str) -> str:
    """Why a worker of another project version is refused (one line with the upgrade command), or "".
    Another version may plan, compute or hash differently: its results must not mix into a render. A
    registration that reports no version (a raw client, an agent from before the check) is let in."""
    theirs = info.get("project_version")
    if theirs is None or str(theirs) == ours:
        return ""
    return (f"worker {worker_id} runs ltx-farm {theirs}, the coordinator {ours}: refused; upgrade it to {ours} "
            f"({installed.UPGRADE_COMMAND})")


class FarmWorkerServicer(farm_pb2_grpc.FarmWorkerServicer):
    """The worker protocol: register, lease (long poll), heartbeat, complete, fail."""

    def __init__(self, store: FarmStore, scheduler: Scheduler, presence: Presence | None = None,
                 bulk: tuple[int, bool] = (0, False)) -> None:
        self.store = store
        self.bulk_port, self.bulk_tls = bulk  # announced at registration: where blobs go at line rate
        self.scheduler = scheduler
        self.presence = presence or Presence(store, scheduler.wake)
        self.guesses = UpcomingGuesses()  # which ready task each busy worker warms its cache for

    def Attach(self, request, context):
        yield from self.presence.attach(request, context)

    def Register(self, request, context):
        if not request.worker_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "worker_id is required")
        try:
            capabilities = check_capabilities(request.capabilities_json)  # typed where the planner reads it
        except SpecError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        info = capabilities.to_dict()  # stored as sent: the scheduler and the fleet lists read it as a dict
        info.setdefault("peer", context.peer())
        refused = version_refusal(request.worker_id, info, installed.project_version())
        self.store.register_worker(request.worker_id, info, resumed=request.resumed, session=request.session,
                                   idle=request.idle, refused=refused)
        if refused:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, refused)
        lease_ms = self.scheduler.lease_ms
        return farm_pb2.RegisterReply(lease_ms=lease_ms, heartbeat_ms=defaults.heartbeat_ms(lease_ms),
                                      bulk_port=self.bulk_port, bulk_tls=self.bulk_tls)

    def Lease(self, request, context):
        return self._lease(request.worker_id, request, min(max(0, request.wait_ms), MAX_WAIT_MS), context)

    def _lease(self, wid: str, request, wait_ms: int, context) -> farm_pb2.LeaseReply:
        """One Lua call per poll (it marks the worker seen); a draining worker is told so at once."""
        task = self.scheduler.lease(wid, list(request.capabilities), wait_ms,
                                    lambda: context.is_active() and not self.store.worker_draining(wid))
        return self._lease_reply(wid, task, context)

    def _lease_reply(self, wid: str, task: dict | None, context) -> farm_pb2.LeaseReply:
        """The worker's reply for a lease granted (or not): a lease it left at once goes back to the queue."""
        if task is None:
            if self.store.worker_draining(wid):  # drained (lease.lua marked it): the worker exits on this reply
                return farm_pb2.LeaseReply(has_task=False, drain=True)
            return farm_pb2.LeaseReply(has_task=False)
        if not context.is_active():  # the worker left while its lease was granted: give it back now
            self.store.lose_leases(wid, "", "the lease reply found no worker", str(task["id"]))
            self.scheduler.wake()
            return farm_pb2.LeaseReply(has_task=False)
        params, inputs = handout(task, as_dict(task.get("params")), as_dict(task.get("inputs")))
        return farm_pb2.LeaseReply(
            has_task=True,
            task_id=str(task["id"]),
            render_id=str(task.get("render") or ""),
            kind=str(task.get("kind") or ""),
            params_json=json.dumps(params, sort_keys=True, default=str),
            inputs={str(k): str(v) for k, v in inputs.items()},
            fence=int(task["fence"]),
            attempts=int(task.get("attempts") or 0),
            lease_ms=self.scheduler.lease_ms,
        )

    def Heartbeat(self, request, context):
        progress = check_progress(request.progress_json).to_dict() if request.progress_json else None
        status, drain = self.store.beat(  # one Lua call: the lease, the worker's liveness, its drain mark
            request.task_id, request.worker_id, request.fence, self.scheduler.lease_ms, progress
        )
        return farm_pb2.StatusReply(status=STATUS[status], drain=drain)

    def Complete(self, request, context):
        metrics = check_small_object(request.metrics_json, "metrics_json") if request.metrics_json else {}
        asked = request.HasField("next")  # the next lease rides on this call (no waiting: the worker long-polls)
        status, message, task = self.scheduler.complete_and_lease(
            request.task_id, request.worker_id, request.fence, dict(request.outputs), metrics,
            list(request.next.capabilities) if asked else []
        )
        reply = farm_pb2.StatusReply(status=STATUS[status], message=message)
        if asked:
            reply.next.CopyFrom(self._lease_reply(request.worker_id, task, context))
        return reply

    def Upcoming(self, request, context):
        """The input blobs of the task this worker's next lease would hand it now, by the lease's own rules
        (read-only: nothing is leased), stepping over tasks another busy worker warms for."""
        caps = [c for c in request.capabilities if 0 < len(c) <= MAX_CAPABILITY_CHARS][:MAX_CAPABILITIES]
        task = self.store.peek_lease(request.worker_id, caps, self.guesses.others(request.worker_id))
        inputs = as_dict(task.get("inputs")) if task else {}
        shas = list(dict.fromkeys(v for v in inputs.values() if isinstance(v, str)))
        guess = [(str(task["id"]), shas)] if task else []
        return farm_pb2.UpcomingReply(shas=self.guesses.pick(request.worker_id, guess))

    def Fail(self, request, context):
        status = self.store.fail(
            request.task_id,
            request.worker_id,
            request.fence,
            request.error[:defaults.ERROR_CHARS],
            retryable=request.retryable,
            seen=True,
            fault=request.fault if request.fault in set(Fault) else "",
        )
        self.scheduler.wake()
        return farm_pb2.StatusReply(status=STATUS[status])
