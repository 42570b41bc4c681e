"""Workers' connections, and RPCs that meet a Redis outage.

Presence serves the Attach stream every worker holds open: when it breaks (the process died, its Mac
dropped off and keepalive gave up), the worker's leases of that session go back to the queue at once,
without spending an attempt. A coordinator that stops, or stops leading, ends the streams without
blaming anyone: the workers reattach wherever the farm is served.

TransientErrors turns an error the coordinator waits out (Redis restarting, blob I/O) into UNAVAILABLE,
which workers and clients retry, instead of UNKNOWN, which they treat as a refusal.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

import grpc

from coordinator.state.store import is_transient
from protos import farm_pb2
from protos.retry import GaveUp, Outage, describe, retry

log = logging.getLogger(__name__)

CHECK_S = 1.0  # how often a held stream checks that this coordinator still serves


class PresenceStore(Protocol):
    """The one store call a broken stream makes: hand the session's leases back."""

    def lose_leases(self, worker_id: str, session: str = "", reason: str = "", task_id: str = "") -> list[str]: ...


class Presence:
    """Attach streams and what a broken one means."""

    def __init__(self, store: PresenceStore, wake: Callable[[], None], serving: Callable[[], bool] = lambda: True,
                 give_up_s: float = 30.0) -> None:
        self.store, self.wake, self.serving = store, wake, serving
        self.give_up_s = give_up_s
        self.stopping = threading.Event()  # set before the server stops: its broken streams blame no one

    def attach(self, request: farm_pb2.AttachRequest, context: grpc.ServicerContext) -> Iterator[farm_pb2.AttachReply]:
        if not request.worker_id or not request.session:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "worker_id and session are required")
        broken = threading.Event()
        if not context.add_callback(broken.set):  # it ended already
            broken.set()
        yield farm_pb2.AttachReply()  # attached: the worker knows it is watched
        while not broken.wait(CHECK_S):
            if self.stopping.is_set() or not self.serving():
                return  # our shutdown or a new leader: the worker reattaches there
        if not self.stopping.is_set() and self.serving():
            self.worker_gone(request.worker_id, request.session, "connection broke")

    def worker_gone(self, worker_id: str, session: str, why: str) -> list[str]:
        """Return the leases of the worker's session now (retried through a blip; past give_up_s the
        lease deadline takes over)."""
        reason = f"{worker_id} went away ({why})"
        try:
            lost = retry(lambda: self.store.lose_leases(worker_id, session, reason), f"returning {worker_id}'s leases",
                         transient=is_transient, log=log, stop=self.stopping, give_up_s=self.give_up_s)
        except GaveUp:
            return []
        log.info("worker %s %s; %s", worker_id, why,
                 f"its tasks went back to the queue: {', '.join(lost)}" if lost else "it held no task")
        if lost:
            self.wake()
        return lost


class TransientErrors(grpc.ServerInterceptor):
    """Farm RPCs that hit a transient error end UNAVAILABLE (retried by the caller), logged once per outage."""

    def __init__(self) -> None:
        self.outage = Outage("rpc", log)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or (handler.request_streaming and handler.response_streaming):
            return handler
        if handler.request_streaming:  # PutBlob: the blob's ref goes to Redis once the bytes are in
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary), handler.request_deserializer, handler.response_serializer)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(handler.unary_stream), handler.request_deserializer, handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(
            self._unary(handler.unary_unary), handler.request_deserializer, handler.response_serializer)

    def _unavailable(self, exc: Exception, context: grpc.ServicerContext) -> None:
        if not (is_transient(exc) or isinstance(exc, GaveUp)):
            raise exc
        self.outage.failed(exc)
        context.abort(grpc.StatusCode.UNAVAILABLE, f"farm state unavailable, retry: {describe(exc)}")

    def _unary(self, behaviour):
        def call(request, context):
            try:
                reply = behaviour(request, context)
            except Exception as exc:  # noqa: BLE001 - sorted in _unavailable
                self._unavailable(exc, context)
            self.outage.ok()
            return reply

        return call

    def _streaming(self, behaviour):
        def call(request, context):
            try:
                yield from behaviour(request, context)
            except Exception as exc:  # noqa: BLE001 - sorted in _unavailable
                self._unavailable(exc, context)

        return call
