"""Shared-secret auth for the farm's gRPC services.

The coordinator creates one token on first start (data_dir/token, mode 0600); clients and workers
send it as `authorization: Bearer <token>` on every call. Health checks stay open so launchd /
load balancers can probe without the secret.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Callable
from pathlib import Path

import grpc

TOKEN_FILE = "token"
_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)

# ~1 MiB blob chunks plus message framing; nothing on this wire needs more.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 0),
    # Reconnect within ~2 s of a coordinator coming back (gRPC's default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]
# Let clients' 30 s keepalive pings through during quiet long polls / watches (the server default
# of 5 minutes would answer them with GOAWAY "too_many_pings").
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.so_reuseport", 0),  # a second coordinator on a busy port fails to bind instead of sharing it
]


def load_or_create_token(data_dir: Path) -> str:
    """Read data_dir/token, creating it atomically with mode 0600 on first start."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        token = path.read_text().strip()
        if not token:
            raise ValueError(f"{path} is empty; delete it to create a new token") from None
        return token
    token = secrets.token_hex(32)  # hex: never starts with "-", so `--token VALUE` always parses
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def read_token(path: Path) -> str:
    """A token file copied from the coordinator (for workers / clients on other Macs)."""
    return Path(path).read_text().strip()


def auth_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying the bearer token."""
    return (("authorization", f"Bearer {token}"),)


def _abort_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same streaming shape that refuses the call."""
    return abort_handler(handler, grpc.StatusCode.UNAUTHENTICATED, "missing or wrong farm token")


def abort_handler(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """A handler of the same streaming shape that ends the call with `code` and `details`."""

    def deny(request_or_iterator, context):  # noqa: ARG001 - gRPC handler signature
        context.abort(code, details)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)


class TokenInterceptor(grpc.ServerInterceptor):
    """Checks the bearer token (constant-time) on every RPC except health."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("empty farm token")
        self._expected = f"Bearer {token}".encode()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method or ""
        if method.startswith(_OPEN_PREFIXES):
            return continuation(handler_call_details)
        presented = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                presented = value.encode() if isinstance(value, str) else bytes(value)
                break
        handler = continuation(handler_call_details)
        if hmac.compare_digest(presented, self._expected):
            return handler
        if handler is None:  # unknown method: still say UNAUTHENTICATED, reveal nothing
            return grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: ctx.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong farm token")
            )
        return _abort_handler(handler)
