"""Who may read and act on the dashboard, and what a request may look like before any view runs.

Why here and not in the views: every route gets the same checks. The ASGI middleware below refuses a
foreign `Host` (DNS rebinding: a page on another name must not read or act here), bodies over
MAX_BODY (413) and bodies that stall (408, then the connection is closed), and stamps the headers
every answer carries. `Gate` holds the farm secret, following the token file through `farm token
rotate`: reads need the secret (Bearer header or the login cookie), actions also a CSRF
double-submit token (cookie == X-CSRF-Token header) and a same-origin `Origin`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
import secrets
import socket
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import anyio

from coordinator.api.auth import FollowedSecret
from protos.auth import JoinToken

CSRF_COOKIE, SESSION_COOKIE, CSRF_HEADER = "farm_csrf", "farm_session", "x-csrf-token"
LOGIN_PARAM = "token"  # `/?token=SECRET`: the link `farm up` prints and `farm dashboard` opens
MAX_BODY = 64 * 1024
REQUEST_TIMEOUT_S = 15.0  # a request line, headers or body that stalls this long ends the connection
BODY_KEY = "farm.body"  # where the middleware leaves the request body, read whole, in the ASGI scope
_SESSION_LABEL = b"ltx-farm dashboard session"
_CSRF_RE = re.compile(r"[A-Za-z0-9_-]{20,100}")
SECURITY_HEADERS = [(b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY")]


def host_allowed(host: str, bound: str = "") -> bool:
    """IP literals (no DNS, so nothing to rebind), localhost, this machine's names, the bound name."""
    host = host.lower().rstrip(".")
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    name = socket.gethostname().lower()
    return host in {"localhost", name, name.split(".")[0], name.split(".")[0] + ".local", bound.lower()}


def host_of(header: str) -> str:
    """The name in a Host header ("" when it cannot be read)."""
    try:
        return urlsplit(f"//{header}").hostname or ""
    except ValueError:
        return ""


def login_url(host: str, port: int, token: str) -> str:
    """The link that logs a browser in, as Jupyter's does: the farm secret in the query, traded by the
    page shell for the session cookie and redirected at once to the clean URL (index in app.py). A
    dashboard bound to every address is linked by this machine's name, which host_allowed accepts."""
    shown = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
    netloc = f"[{shown}]" if ":" in shown else shown
    return f"http://{netloc}:{port}/?{LOGIN_PARAM}={quote(JoinToken.parse(token).secret, safe='')}"


def cookies_of(header: str) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # noqa: BLE001 - a malformed cookie header is just no cookies
        return {}
    return {k: m.value for k, m in jar.items()}


class Gate:
    """The farm secret and the checks made with it. Without a token the dashboard is read-only and
    open (a test farm); with one, nothing but the page shell, health, time and login is served
    without it."""

    def __init__(self, token: str | None, token_file: Path | None = None) -> None:
        self._secret = FollowedSecret(token, token_file) if token else None

    @property
    def enabled(self) -> bool:
        return self._secret is not None

    def session_value(self) -> str:
        """The login cookie: derived from the secret, so a rotated secret ends every session and the
        browser never holds the secret itself."""
        secret = self._secret.get().encode() if self._secret else b""
        return hmac.new(secret, _SESSION_LABEL, hashlib.sha256).hexdigest()

    def secret_matches(self, presented: str) -> bool:
        """A bare secret or a whole join token, compared in constant time."""
        if self._secret is None:
            return False
        try:
            secret = JoinToken.parse(presented).secret
        except ValueError:
            return False
        return hmac.compare_digest(secret.encode(), self._secret.get().encode())

    def token_ok(self, headers: Any, cookies: dict[str, str]) -> bool:
        """The request carries the secret (Bearer) or this secret's login cookie."""
        if self._secret is None:
            return False
        auth = headers.get("authorization", "")
        if auth.startswith("Bearer "):
            return self.secret_matches(auth[7:].strip())
        return hmac.compare_digest(cookies.get(SESSION_COOKIE, "").encode(), self.session_value().encode())

    def may_read(self, headers: Any, cookies: dict[str, str]) -> bool:
        return not self.enabled or self.token_ok(headers, cookies)

    def refusal(self, headers: Any, cookies: dict[str, str], need_token: bool = True) -> str | None:
        """Why this POST must be refused (403), or None: read-only, foreign origin, token, CSRF."""
        if not self.enabled:
            return "the dashboard is read-only (started without the farm token)"
        origin = headers.get("origin")
        if origin and origin != "null" and urlsplit(origin).netloc != headers.get("host", ""):
            return f"cross-origin request from {origin[:100]} refused"
        if need_token and not self.token_ok(headers, cookies):
            return "missing or wrong farm token"
        cookie, header = cookies.get(CSRF_COOKIE, ""), headers.get(CSRF_HEADER, "")
        if not cookie or not header or not hmac.compare_digest(cookie.encode(), header.encode()):
            return "missing or mismatched CSRF token (send the farm_csrf cookie's value as X-CSRF-Token)"
        return None


def csrf_token(cookies: dict[str, str]) -> tuple[str, bool]:
    """The caller's CSRF token and whether it is new (then the caller sets the cookie)."""
    current = cookies.get(CSRF_COOKIE)
    if current and _CSRF_RE.fullmatch(current):
        return current, False
    return secrets.token_urlsafe(24), True


def form_or_json(body: bytes, content_type: str) -> dict:
    """A POST body as a dict: JSON when it says so, else a urlencoded form. Bad JSON raises ValueError."""
    if "application/json" in content_type:
        try:
            value = json.loads(body or b"{}")
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None
        return value if isinstance(value, dict) else {}
    return {k: v[-1] for k, v in parse_qs(body.decode(errors="replace")).items()}


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RequestGuard:
    """ASGI middleware run before routing: Host check (421), body whole, bounded and timed (413, 408,
    400) and left in the scope for the views, security headers on every answer."""

    def __init__(self, app: Any, bound_host: str = "", timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.app, self.bound_host, self.timeout_s = app, bound_host, timeout_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}

        async def stamped(message: dict) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *((k, v) for k, v in SECURITY_HEADERS if k not in present)]
            await send(message)

        try:
            host = host_of(headers.get("host", ""))
            if not host_allowed(host, self.bound_host):
                raise _Refused(421, f"Host {host[:80]!r} is not this dashboard's name")
            scope[BODY_KEY] = await self._body(headers, receive)
        except _Refused as why:
            await _answer(stamped, why.status, str(why), close=True)
            return
        except OSError:  # the client left while sending
            return
        await self.app(scope, _replay(scope[BODY_KEY], receive), stamped)

    async def _body(self, headers: dict, receive: Any) -> bytes:
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_BODY:
            raise _Refused(413, f"request body must be 0..{MAX_BODY} bytes")
        chunks, size = [], 0
        try:
            with anyio.fail_after(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise OSError("client left")
                    chunks.append(message.get("body", b""))
                    size += len(chunks[-1])
                    if size > MAX_BODY:
                        raise _Refused(413, f"request body must be 0..{MAX_BODY} bytes")
                    if not message.get("more_body"):
                        return b"".join(chunks)
        except TimeoutError:
            raise _Refused(408, f"request body not received within {self.timeout_s:g} s") from None


def _replay(body: bytes, receive: Any) -> Any:
    """A receive that hands the app the body read by the guard, then the client's own messages (a
    disconnect, which ends an event stream)."""
    sent = False

    async def replayed() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _answer(send: Any, status: int, message: str, close: bool = False) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:  # an unread body must not be taken for the next request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
