"""No handler ends in UNKNOWN: ids checked where requests enter, refusals mapped to a status code.

Wraps every farm handler: request fields that name Redis keys (render_id, worker_id, task_id) must
be ids (coordinator.schema.check_id), a worker RPC must name its worker, a SpecError raised anywhere
below is INVALID_ARGUMENT, and any other exception is logged with its traceback and answered
INTERNAL in one line (grpcio would answer UNKNOWN and log nothing useful).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from coordinator.plan.graph import SpecError
from coordinator.schema import check_id

log = logging.getLogger(__name__)

ID_FIELDS = (("render_id", "render id", False), ("worker_id", "worker id", False), ("task_id", "task id", True))
WORKER_SERVICE = "/ltxfarm.v1.FarmWorker/"


class Undecodable:
    """What a request that does not parse as its message becomes: refused INVALID_ARGUMENT by the
    handler's wrapper. grpcio's own path for a failed parse (log, INTERNAL) keeps ~16 KB per call."""


UNDECODABLE = Undecodable()


def _tolerant(deserialize: Callable | None) -> Callable | None:
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception:  # noqa: BLE001 - DecodeError and friends: the wrapper answers for it
            return UNDECODABLE
    return parse


def _as_is(serialize: Callable | None) -> Callable | None:
    """A reply already in wire bytes (a Watch event the hub encoded once for all its watchers) goes as is."""
    if serialize is None:
        return None
    return lambda reply: reply if isinstance(reply, bytes) else serialize(reply)


def _decoded(requests: Any) -> Any:
    """A request stream that refuses an undecodable message where it appears."""
    for request in requests:
        if request is UNDECODABLE:
            raise SpecError("a request message does not decode")
        yield request


def check_request(method: str, request: Any) -> None:
    """SpecError when an id field holds something that is not an id (or a worker RPC names no worker)."""
    if request is UNDECODABLE:
        raise SpecError(f"the request does not decode as {method.rsplit('/', 1)[-1]}'s message")
    for field, kind, task in ID_FIELDS:
        value = getattr(request, field, None)
        if not isinstance(value, str):
            continue
        if value or (field == "worker_id" and method.startswith(WORKER_SERVICE)):
            check_id(kind, value, task=task)


class Guard(grpc.ServerInterceptor):
    """Entry checks and the last word on exceptions, for every handler shape."""

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method or ""
        wrap, make = self._shape(handler)
        behaviour = wrap(method, getattr(handler, self._attr(handler)))
        return make(behaviour, _tolerant(handler.request_deserializer), _as_is(handler.response_serializer))

    @staticmethod
    def _attr(handler: grpc.RpcMethodHandler) -> str:
        return {(False, False): "unary_unary", (False, True): "unary_stream", (True, False): "stream_unary",
                (True, True): "stream_stream"}[(handler.request_streaming, handler.response_streaming)]

    def _shape(self, handler: grpc.RpcMethodHandler) -> tuple[Callable, Callable]:
        if handler.response_streaming:
            make = (grpc.stream_stream_rpc_method_handler if handler.request_streaming
                    else grpc.unary_stream_rpc_method_handler)
            return self._streaming(not handler.request_streaming), make
        make = grpc.stream_unary_rpc_method_handler if handler.request_streaming else grpc.unary_unary_rpc_method_handler
        return self._unary(not handler.request_streaming), make

    @staticmethod
    def _unary(check: bool) -> Callable:
        def wrap(method: str, behaviour: Callable) -> Callable:
            def call(request, context):
                try:
                    if check:
                        check_request(method, request)
                    return behaviour(request if check else _decoded(request), context)
                except Exception as exc:  # noqa: BLE001 - mapped (or re-raised when already answered)
                    _answer(method, exc, context)
            return call
        return wrap

    @staticmethod
    def _streaming(check: bool) -> Callable:
        def wrap(method: str, behaviour: Callable) -> Callable:
            def call(request, context):
                try:
                    if check:
                        check_request(method, request)
                    yield from behaviour(request if check else _decoded(request), context)
                except Exception as exc:  # noqa: BLE001 - mapped (or re-raised when already answered)
                    _answer(method, exc, context)
            return call
        return wrap


def _answer(method: str, exc: Exception, context: grpc.ServicerContext) -> None:
    """Re-raise a call that already has its status (context.abort); otherwise give it one."""
    if context.code() not in (None, grpc.StatusCode.OK):
        raise exc
    if isinstance(exc, SpecError):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc).splitlines()[0] if str(exc) else "bad request")
    log.exception("%s failed", method)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method.rsplit('/', 1)[-1]} "
                  f"({type(exc).__name__}); the coordinator's log has the traceback")
