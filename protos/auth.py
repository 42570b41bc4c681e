"""The farm's join token and TLS channels: what workers, clients and the coordinator share.

A join token is `LTXF1.<sha256 of the farm CA's DER>.<secret>` (the k3s idea). A worker or laptop
given only the token opens a bare TLS handshake to the coordinator, takes the CA from the chain the
server presents, and uses it only if its sha256 is the token's fingerprint; the gRPC channel then
verifies the server's certificate against that CA before the secret (sent as call metadata) leaves.
There is no plaintext path: a token without a fingerprint is refused with one line.
"""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

TOKEN_PREFIX = "LTXF1"
# Every coordinator certificate carries this name and every client checks it (whatever address it
# dialled), so a farm reached by IP, hostname or a NAT address verifies the same way: the pinned CA,
# which signs only this farm's coordinators, is what makes the server trusted.
SERVER_NAME = "coordinator.ltx-farm"
NOT_THIS_FARM = "is not the farm of this token"

# ~1 MiB blob chunks plus message framing; nothing on this wire needs more.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

# HTTP/2 keepalive, both ways: a peer that stops answering pings (a Mac frozen, asleep, or cut off
# without a TCP reset) is declared gone at most KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS after it
# went silent. The coordinator then returns that worker's leases (its Attach stream broke:
# coordinator/api/presence.py) in ~7 s instead of at the 30 s lease deadline; a worker or client drops a
# vanished coordinator as fast and follows the next. Pings are ~20 bytes every 3 s per connection;
# the ack comes from gRPC's own I/O threads, so a busy worker still answers in time.
KEEPALIVE_TIME_MS = 3_000
KEEPALIVE_TIMEOUT_MS = 4_000
KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),  # gRPC >= 1.5x times every ping out by this
    ("grpc.keepalive_permit_without_calls", 1),  # an idle channel notices a vanished peer too
    ("grpc.http2.max_pings_without_data", 0),  # an Attach stream carries no data after its ack: ping on
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS),
]
# What the coordinator's server adds: its own pings (above), and the clients' pings accepted at this
# rate without strikes (gRPC's default answers a ping more often than every 5 minutes with GOAWAY).
SERVER_KEEPALIVE_OPTIONS = [
    *KEEPALIVE_OPTIONS,
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
]
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    *KEEPALIVE_OPTIONS,
    # Reconnect within ~2 s of a coordinator coming back (gRPC's default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class TokenError(ValueError):
    """A token that cannot be used; str() is one line for the terminal."""


@dataclass(frozen=True)
class JoinToken:
    """The CA fingerprint to pin ("" for a plaintext loopback farm) and the secret sent per call."""

    fingerprint: str
    secret: str

    @classmethod
    def parse(cls, text: str) -> JoinToken:
        """`LTXF1.<fp>.<secret>`; anything else is a bare secret (no fingerprint)."""
        text = (text or "").strip()
        if not text:
            raise TokenError(NO_TOKEN)
        parts = text.split(".", 2)
        if len(parts) == 3 and parts[0] == TOKEN_PREFIX:
            fingerprint, secret = parts[1].lower(), parts[2]
            if len(fingerprint) != 64 or any(c not in "0123456789abcdef" for c in fingerprint) or not secret:
                raise TokenError("farm token is damaged (LTXF1.<64 hex>.<secret> expected)")
            return cls(fingerprint, secret)
        return cls("", text)

    def __str__(self) -> str:
        return f"{TOKEN_PREFIX}.{self.fingerprint}.{self.secret}" if self.fingerprint else self.secret


def read_token(path: Path) -> str:
    """A token file copied from the coordinator (for workers / clients on other Macs)."""
    return Path(path).read_text().strip()


KEYCHAIN_SERVICE = "ltx-farm"
NO_TOKEN = ("no farm token: give --token-file PATH (a copy of the coordinator's DATA/token, ~/.ltx-farm/token by "
            "default), set FARM_TOKEN or FARM_TOKEN_FILE, or on a Mac store it in the keychain "
            f"(security add-generic-password -s {KEYCHAIN_SERVICE} -a farm -w)")
TOKEN_ON_ARGV = ("a token on the command line shows in `ps` to every user of this machine: give --token-file PATH, "
                 f"FARM_TOKEN, or (on a Mac) the keychain item {KEYCHAIN_SERVICE}")


def keychain_token(platform: str = sys.platform) -> str:
    """The token a Mac keeps in its keychain (generic password, service ltx-farm); '' elsewhere or when
    there is none. Only darwin has `security`; nothing is run on other systems."""
    if platform != "darwin":
        return ""
    try:
        found = subprocess.run(["security", "find-generic-password", "-s", KEYCHAIN_SERVICE, "-w"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return found.stdout.strip() if found.returncode == 0 else ""


def resolve_token(token_file: Path | None = None, *, fallback_files: tuple[Path, ...] = (),
                  env: Mapping[str, str] | None = None, platform: str = sys.platform) -> str:
    """The farm token from the first source that has one: the file the user named (--token-file), then
    FARM_TOKEN, then the file FARM_TOKEN_FILE names, then the macOS keychain, then fallback_files (a
    client's configured file, DATA/token). '' when none has one. Never the command line, which `ps`
    shows to everyone; a named file that cannot be read is a TokenError, not a silent fallback."""
    env = os.environ if env is None else env
    named = token_file or (Path(env["FARM_TOKEN_FILE"]).expanduser() if env.get("FARM_TOKEN_FILE") else None)
    if token_file is not None:
        return _read_named(token_file)
    if env.get("FARM_TOKEN", "").strip():
        return env["FARM_TOKEN"].strip()
    if named is not None:
        return _read_named(named)
    from_keychain = keychain_token(platform)
    if from_keychain:
        return from_keychain
    for path in fallback_files:
        if Path(path).expanduser().is_file():
            return read_token(Path(path).expanduser())
    return ""


def _read_named(path: Path) -> str:
    try:
        return read_token(Path(path).expanduser())
    except OSError as exc:
        raise TokenError(f"cannot read the token file {path} ({exc.strerror or exc.__class__.__name__})") from None


def auth_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying the secret of the token (never the fingerprint part)."""
    return (("authorization", f"Bearer {JoinToken.parse(token).secret}"),)


def cert_fingerprint(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise TokenError(f"coordinator address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


_CA_CACHE: dict[str, bytes] = {}
_CA_LOCK = threading.Lock()


def fetch_ca(address: str, fingerprint: str, timeout: float = 5.0) -> bytes:
    """The CA PEM whose sha256 is `fingerprint`, taken from the chain the server at `address`
    presents in a bare TLS handshake (no secret is sent). OSError when unreachable, TokenError when
    no certificate in the chain matches the token (someone else answers at that address)."""
    with _CA_LOCK:
        if fingerprint in _CA_CACHE:
            return _CA_CACHE[fingerprint]
    host, port = _host_port(address)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # we verify by fingerprint below, then gRPC verifies the chain
    context.set_alpn_protocols(["h2"])
    with socket.create_connection((host, port), timeout=timeout) as raw:
        with context.wrap_socket(raw, server_hostname=SERVER_NAME) as tls:
            chain = _unverified_chain(tls)
    for der in chain:
        if cert_fingerprint(der) == fingerprint:
            pem = ssl.DER_cert_to_PEM_cert(der).encode()
            with _CA_LOCK:
                _CA_CACHE[fingerprint] = pem
            return pem
    raise TokenError(f"the coordinator at {address} {NOT_THIS_FARM} (its CA fingerprint "
                     "differs); the secret was not sent")


def _unverified_chain(tls: ssl.SSLSocket) -> list[bytes]:
    """DER certificates the server sent (SSLSocket.get_unverified_chain is public from 3.13)."""
    if hasattr(tls, "get_unverified_chain"):
        return [bytes(c) if isinstance(c, bytes) else c.public_bytes(ssl._ssl.ENCODING_DER)  # type: ignore[attr-defined]
                for c in tls.get_unverified_chain()]
    return [c.public_bytes(ssl._ssl.ENCODING_DER) for c in tls._sslobj.get_unverified_chain()]  # type: ignore[attr-defined]


class _Refused(grpc.RpcError, grpc.Call):
    """What a call on a channel without a verified coordinator raises: the caller's usual RpcError."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> tuple:
        return ()

    def trailing_metadata(self) -> tuple:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


class _Lazy:
    """A multi-callable that resolves the real channel when called (so a coordinator that is not up
    yet, or answers with the wrong CA, is an RpcError at call time, retried like any other)."""

    def __init__(self, owner: PinnedChannel, kind: str, args: tuple, kwargs: dict) -> None:
        self._owner, self._kind, self._args, self._kwargs = owner, kind, args, kwargs

    def _real(self) -> Any:
        channel = self._owner.resolve()
        return getattr(channel, self._kind)(*self._args, **self._kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._real()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # with_call, future
        return getattr(self._real(), name)


class PinnedChannel(grpc.Channel):
    """A TLS channel to one coordinator whose CA is pinned by the join token's fingerprint."""

    def __init__(self, address: str, token: JoinToken, options: list | None = None) -> None:
        self.address, self.token = address, token
        self._options = [*(options or CHANNEL_OPTIONS), ("grpc.ssl_target_name_override", SERVER_NAME)]
        self._channel: grpc.Channel | None = None
        self._lock = threading.Lock()

    def resolve(self) -> grpc.Channel:
        with self._lock:
            if self._channel is None:
                try:
                    ca = fetch_ca(self.address, self.token.fingerprint)
                except TokenError as exc:
                    raise _Refused(grpc.StatusCode.UNAVAILABLE, str(exc)) from None
                except (OSError, ValueError) as exc:
                    raise _Refused(grpc.StatusCode.UNAVAILABLE,
                                   f"coordinator at {self.address} unreachable ({exc.__class__.__name__})") from None
                credentials = grpc.ssl_channel_credentials(root_certificates=ca)
                self._channel = grpc.secure_channel(self.address, credentials, options=self._options)
            return self._channel

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _Lazy(self, "unary_unary", args, kwargs)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _Lazy(self, "unary_stream", args, kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _Lazy(self, "stream_unary", args, kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _Lazy(self, "stream_stream", args, kwargs)

    def subscribe(self, callback: Any, try_to_connect: bool = False) -> None:
        self.resolve().subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Any) -> None:
        if self._channel is not None:
            self._channel.unsubscribe(callback)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    def __enter__(self) -> PinnedChannel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def farm_channel(address: str, token: str, options: list | None = None) -> grpc.Channel:
    """The one way to open a channel to a coordinator: TLS, its CA pinned by the token's fingerprint."""
    parsed = JoinToken.parse(token)
    if not parsed.fingerprint:
        raise TokenError("this farm token has no CA fingerprint: use the join token (LTXF1.…) in the coordinator's "
                         "DATA/token (~/.ltx-farm/token by default), as a token file or FARM_TOKEN")
    return PinnedChannel(address, parsed, options)
