"""The coordinator's side of the join token: the token file and the check on every call.

The coordinator creates its CA (coordinator/api/tls.py) and a secret on first start; DATA/token (mode
0600) holds the join token, CA fingerprint + secret (protos/auth.py). Clients send the secret as
`authorization: Bearer <secret>` over TLS on every call. Health checks stay open so launchd / load
balancers can probe without the secret.
"""

from __future__ import annotations

import hmac
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from coordinator.api.tls import load_or_create_tls
from protos.auth import (  # noqa: F401 - re-exported: older imports of coordinator.api.auth keep working
    CHANNEL_OPTIONS,
    MAX_MESSAGE_BYTES,
    SERVER_KEEPALIVE_OPTIONS,
    TOKEN_PREFIX,
    JoinToken,
    auth_metadata,
    read_token,
)

TOKEN_FILE = "token"
_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)

# Keepalive both ways (protos/auth.py): the server pings every connection, so a silent worker's
# Attach stream breaks within seconds, and lets the clients' own pings through during quiet long
# polls / watches.
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    *SERVER_KEEPALIVE_OPTIONS,
    ("grpc.so_reuseport", 0),  # a second coordinator on a busy port fails to bind instead of sharing it
]


PING_TIMINGS = ("grpc.keepalive_time_ms", "grpc.keepalive_timeout_ms", "grpc.http2.ping_timeout_ms")


def server_options(ping_ms: int | None = None) -> list[tuple[str, int]]:
    """SERVER_OPTIONS, or with the server pinging every `ping_ms` and waiting as long for each answer
    (None: the defaults, a silent peer gone within seconds): a farm on a slow link, or one that wants a
    frozen worker counted until its lease deadline, gives its peers that long."""
    if ping_ms is None:
        return list(SERVER_OPTIONS)
    return [(name, int(ping_ms) if name in PING_TIMINGS else value) for name, value in SERVER_OPTIONS]


def load_or_create_token(data_dir: Path) -> str:
    """The farm's join token (CA fingerprint + secret), kept in data_dir/token (mode 0600): the CA
    (DATA/tls) and the secret are created on first start; a bare secret from before TLS is kept and
    rewritten as a join token."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = load_or_create_tls(data_dir).fingerprint
    path = data_dir / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        text = path.read_text().strip()
        if not text:
            raise ValueError(f"{path} is empty; delete it to create a new token") from None
        token = JoinToken(fingerprint, JoinToken.parse(text).secret)
        if str(token) != text:
            write_token(path, token)
        return str(token)
    token = JoinToken(fingerprint, new_secret())
    with os.fdopen(fd, "w") as f:
        f.write(f"{token}\n")
    return str(token)


def new_secret() -> str:
    return secrets.token_hex(32)  # hex: a token never starts with "-"


def rotate_token(data_dir: Path) -> str:
    """A new secret for the farm, same CA: written to DATA/token, which the running coordinator and
    the workers reading that file follow within seconds; copies on other Macs need the new file."""
    token = JoinToken(load_or_create_tls(data_dir).fingerprint, new_secret())
    write_token(Path(data_dir) / TOKEN_FILE, token)
    return str(token)


def write_token(path: Path, token: JoinToken) -> None:
    """Replace a token file atomically, mode 0600 (a reader sees the old or the new token, whole)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{token}\n")
    os.replace(tmp, path)


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


def _bearer_secret(value: bytes) -> bytes:
    """`Bearer <secret>` as sent; a whole join token as bearer is reduced to its secret."""
    prefix = b"Bearer "
    if value.startswith(prefix + TOKEN_PREFIX.encode() + b"."):
        return prefix + value[len(prefix):].split(b".", 2)[-1]
    return value


class FollowedSecret:
    """The farm secret, re-read from the token file it came from when that file changes (`farm token
    rotate` writes a new one there; its mtime is checked at most once a second). The gRPC interceptor
    and the dashboard share it, so both follow a rotation the same way."""

    def __init__(self, token: str, token_file: Path | None = None) -> None:
        self._secret = JoinToken.parse(token).secret
        self._file, self._stamp, self._checked = token_file, self._mtime(token_file), time.monotonic()

    @staticmethod
    def _mtime(path: Path | None) -> float:
        try:
            return path.stat().st_mtime if path is not None else 0.0
        except OSError:
            return 0.0

    def get(self) -> str:
        """The current secret."""
        if self._file is not None and time.monotonic() - self._checked >= 1.0:
            self._checked = time.monotonic()
            stamp = self._mtime(self._file)
            if stamp != self._stamp:
                try:
                    self._secret = JoinToken.parse(read_token(self._file)).secret
                    self._stamp = stamp
                except (OSError, ValueError):
                    pass  # a half-written or unreadable file: keep the last good secret
        return self._secret


class TokenInterceptor(grpc.ServerInterceptor):
    """Checks the bearer token (constant-time) on every RPC except health. Given the token file it came
    from, it follows that file (FollowedSecret)."""

    def __init__(self, token: str, token_file: Path | None = None) -> None:
        self._secret = FollowedSecret(token, token_file)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method or ""
        if method.startswith(_OPEN_PREFIXES):
            return continuation(handler_call_details)
        expected = f"Bearer {self._secret.get()}".encode()
        presented = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                presented = _bearer_secret(value.encode() if isinstance(value, str) else bytes(value))
                break
        handler = continuation(handler_call_details)
        if hmac.compare_digest(presented, expected):
            return handler
        if handler is None:  # unknown method: still say UNAUTHENTICATED, reveal nothing
            return grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: ctx.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong farm token")
            )
        return _abort_handler(handler)
