"""The coordinator's web dashboard: a one-page app, a JSON API, live Server-Sent Events and /metrics.

stdlib ThreadingHTTPServer in a daemon thread, so the coordinator needs no web framework. Every read
comes straight from the store (Redis is the truth; nothing is cached here). Reads are open to whoever
can reach the port (127.0.0.1 by default). Actions (cancel, requeue, priority) need the farm token
(Bearer header or the login cookie) AND a CSRF double-submit token (cookie == X-CSRF-Token header),
so a page on another origin cannot act with an operator's cookie; without a token the dashboard is
read-only.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from coordinator import metrics

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("dashboard_static")
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
SSE_BLOCK_MS = 1_000  # XREAD BLOCK per loop: also how fast a stream notices shutdown
KEEPALIVE_S = 10.0  # an SSE comment this often keeps proxies and browsers from timing out
ALL_EVENTS_RENDERS = 50  # /api/events follows the newest this many renders
CSRF_COOKIE, TOKEN_COOKIE, CSRF_HEADER = "farm_csrf", "farm_token", "X-CSRF-Token"
_ID = r"([A-Za-z0-9][A-Za-z0-9._:-]{0,200})"
MAX_BODY = 64 * 1024
REQUEST_TIMEOUT_S = 15.0


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
BlobReader = Callable[[str], bytes | None]


class DashboardServer(ThreadingHTTPServer):
    """The HTTP server with what handlers need: the store, the token, where previews live."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        store: Any,
        token: str | None,
        blob_reader: BlobReader | None,
        data_dir: Path | None,
    ) -> None:
        super().__init__(address, DashboardHandler)
        self.store = store
        self.token = token or None
        self.blob_reader = blob_reader
        self.data_dir = Path(data_dir) if data_dir else None
        self.stopping = threading.Event()


def start_dashboard(
    store: Any,
    host: str = "127.0.0.1",
    port: int = 8470,
    token: str | None = None,
    blob_reader: BlobReader | None = None,
    data_dir: Path | None = None,
) -> tuple[DashboardServer, int]:
    """Serve the dashboard from a daemon thread; returns (server, bound port). Port 0 picks a free one."""
    server = DashboardServer((host, port), store, token, blob_reader, data_dir)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="farm-dashboard", daemon=True
    )
    thread.start()
    bound = server.server_address[1]
    log.info(
        "dashboard on http://%s:%d/ (%s)",
        host,
        bound,
        "actions need the farm token" if token else "read-only",
    )
    return server, bound


def stop_dashboard(server: DashboardServer) -> None:
    """Stop accepting, end the SSE loops (within one XREAD block) and close the socket."""
    server.stopping.set()
    server.shutdown()
    server.server_close()


def find_preview(server: DashboardServer, render: dict) -> tuple[str, Any] | None:
    """Where the render's preview PNG is: ("path", Path) or ("blob", sha); None when there is none."""
    path = render.get("preview_path")
    if path and Path(path).is_file():
        return "path", Path(path)
    sha = render.get("preview_sha") or render.get("preview_blob")
    if sha and server.blob_reader is not None:
        return "blob", sha
    if server.data_dir is not None:
        candidate = server.data_dir / "previews" / f"{render['id']}.png"
        if candidate.is_file():
            return "path", candidate
    return None


class DashboardHandler(BaseHTTPRequestHandler):
    """Routes GET (pages, API, SSE, metrics) and POST (actions) requests."""

    server: DashboardServer
    server_version = "ltx-farm-dashboard"
    timeout = REQUEST_TIMEOUT_S  # a request line, headers or body that stalls ends the connection

    GET_ROUTES: tuple[tuple[re.Pattern, str], ...] = tuple(
        (re.compile(p + "$"), name)
        for p, name in (
            (r"/(?:index\.html)?", "index"),
            (r"/static/([a-z]+\.(?:js|css|html))", "static"),
            (r"/api/renders", "renders"),
            (rf"/api/renders/{_ID}", "render"),
            (rf"/api/renders/{_ID}/events", "render_events"),
            (rf"/api/renders/{_ID}/preview\.png", "preview"),
            (rf"/api/renders/{_ID}/video\.mp4", "video"),
            (r"/api/events", "all_events"),
            (r"/api/workers", "workers"),
            (r"/api/metrics-summary", "summary"),
            (r"/api/session", "session"),
            (r"/api/time", "time"),
            (r"/metrics", "metrics"),
            (r"/healthz", "health"),
        )
    )
    POST_ROUTES: tuple[tuple[re.Pattern, str], ...] = tuple(
        (re.compile(p + "$"), name)
        for p, name in (
            (r"/api/login", "login"),
            (r"/api/logout", "logout"),
            (rf"/api/renders/{_ID}/cancel", "cancel"),
            (rf"/api/renders/{_ID}/priority", "priority"),
            (rf"/api/tasks/{_ID}/requeue", "requeue"),
            (rf"/api/workers/{_ID}/drain", "drain"),
            (rf"/api/renders/{_ID}/requeue", "render_requeue"),
        )
    )

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: one debug line per request
        log.debug("%s " + fmt, self.address_string(), *args)

    # ------------------------------------------------------------------ plumbing

    def _dispatch(self, routes: tuple[tuple[re.Pattern, str], ...], prefix: str) -> None:
        url = urlsplit(self.path)
        self.query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        for pattern, name in routes:
            match = pattern.match(url.path)
            if match:
                try:
                    getattr(self, f"{prefix}_{name}")(*match.groups())
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the browser left (closed tab, SSE reconnect)
                except (ValueError, KeyError, TypeError) as exc:  # the request was wrong: 400, one line
                    with contextlib.suppress(OSError):
                        self._json({"error": f"bad request: {str(exc).splitlines()[0][:200] if str(exc) else ''}"},
                                   HTTPStatus.BAD_REQUEST)
                except Exception:  # one JSON error, never a hung connection, never a traceback to the client
                    if self.server.stopping.is_set():
                        return  # shutting down: Redis may already be gone under an SSE loop
                    log.exception("dashboard %s %s failed", self.command, url.path)
                    with contextlib.suppress(OSError):
                        self._json({"error": "internal error; the coordinator's log has the details"},
                                   HTTPStatus.INTERNAL_SERVER_ERROR)
                return
        self._json({"error": f"no such page {url.path}"}, HTTPStatus.NOT_FOUND)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self._host_ok():
            self._dispatch(self.GET_ROUTES, "get")

    def do_POST(self) -> None:  # noqa: N802
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit() or int(length) > MAX_BODY:
            self.close_connection = True  # the unread body must not be taken for the next request
            with contextlib.suppress(OSError):  # a client still sending may reset before it reads this
                self._json({"error": f"request body must be 0..{MAX_BODY} bytes with a Content-Length"},
                           HTTPStatus.REQUEST_ENTITY_TOO_LARGE if length.isdigit() else HTTPStatus.BAD_REQUEST)
            return
        try:  # read first: a refusal must not reset; a stalled body times out (timeout below)
            self._raw_body = self.rfile.read(int(length)) if int(length) > 0 else b""
        except TimeoutError:
            self.close_connection = True
            return
        if self._host_ok():
            self._dispatch(self.POST_ROUTES, "post")

    def _host_ok(self) -> bool:
        """DNS rebinding: a page served from another name must not read or act here. Accept IP literals,
        localhost and this machine's names; anything else is 421 (Misdirected Request)."""
        host = urlsplit(f"//{self.headers.get('Host', '')}").hostname or ""
        if host_allowed(host, self.server.server_address[0]):
            return True
        self.close_connection = True
        self._json({"error": f"Host {host[:80]!r} is not this dashboard's name"}, HTTPStatus.MISDIRECTED_REQUEST)
        return False

    def _send(
        self,
        body: bytes,
        ctype: str,
        status: int = HTTPStatus.OK,
        headers: dict | None = None,
        cookies: list[str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        for c in cookies or []:
            self.send_header("Set-Cookie", c)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value: Any, status: int = HTTPStatus.OK, cookies: list[str] | None = None) -> None:
        self._send(json.dumps(value, default=str).encode(), "application/json", status, cookies=cookies)

    def _cookies(self) -> dict[str, str]:
        jar = SimpleCookie()
        try:
            jar.load(self.headers.get("Cookie", ""))
        except Exception:  # noqa: BLE001 - a malformed cookie header is just no cookies
            return {}
        return {k: m.value for k, m in jar.items()}

    def _csrf_cookie(self) -> tuple[str, list[str]]:
        """The caller's CSRF token, minting one (and its Set-Cookie) on first visit."""
        current = self._cookies().get(CSRF_COOKIE)
        if current and re.fullmatch(r"[A-Za-z0-9_-]{20,100}", current):
            return current, []
        fresh = secrets.token_urlsafe(24)
        return fresh, [f"{CSRF_COOKIE}={fresh}; Path=/; SameSite=Strict"]

    def _body(self) -> dict:
        raw = getattr(self, "_raw_body", b"")
        if "application/json" in (self.headers.get("Content-Type") or ""):
            value = json.loads(raw or b"{}")
            return value if isinstance(value, dict) else {}
        return {k: v[-1] for k, v in parse_qs(raw.decode(errors="replace")).items()}

    # ------------------------------------------------------------------ pages and JSON

    def get_index(self) -> None:
        _, cookies = self._csrf_cookie()
        self._send((STATIC_DIR / "index.html").read_bytes(), STATIC_TYPES[".html"], cookies=cookies)

    def get_static(self, name: str) -> None:
        path = STATIC_DIR / name
        if not path.is_file():
            self._json({"error": f"no static file {name}"}, HTTPStatus.NOT_FOUND)
            return
        self._send(path.read_bytes(), STATIC_TYPES[path.suffix])

    def get_renders(self) -> None:
        limit = max(1, min(int(self.query.get("limit", 50)), 500))
        self._json({"renders": metrics.list_summaries(self.server.store, limit)})

    def get_render(self, render_id: str) -> None:
        detail = metrics.render_detail(self.server.store, render_id)
        if detail is None:
            self._json({"error": f"no render {render_id}"}, HTTPStatus.NOT_FOUND)
            return
        found = find_preview(self.server, detail["render"])
        stamp = int(found[1].stat().st_mtime * 1000) if found and found[0] == "path" else 0
        detail["preview"] = f"/api/renders/{render_id}/preview.png?v={stamp}" if found else None
        detail["actions"] = self.server.token is not None
        output = detail["render"].get("output")
        done = detail["render"].get("state") == "done" and output and Path(output).is_file()
        detail["video"] = f"/api/renders/{render_id}/video.mp4" if done else None
        self._json(detail)

    def get_video(self, render_id: str) -> None:
        """The finished mp4 for the page's player and download link: only with the farm token (cookie or
        Bearer), from the path the coordinator itself recorded; Range requests let the player seek."""
        if not self._token_ok():
            self._json({"error": "log in with the farm token to play or download videos"}, HTTPStatus.FORBIDDEN)
            return
        render = self.server.store.get_render(render_id) or {}
        path = Path(render.get("output") or "")
        if render.get("state") != "done" or not path.is_file():
            self._json({"error": f"render {render_id} has no video"}, HTTPStatus.NOT_FOUND)
            return
        size = path.stat().st_size
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        start, end = (int(match[1] or 0), min(int(match[2] or size - 1), size - 1)) if match else (0, size - 1)
        status = HTTPStatus.PARTIAL_CONTENT if match else HTTPStatus.OK
        headers = {"Accept-Ranges": "bytes", "Content-Range": f"bytes {start}-{end}/{size}"} if match else \
            {"Accept-Ranges": "bytes"}
        if self.query.get("download"):
            headers["Content-Disposition"] = f'attachment; filename="{render_id}.mp4"'
        with open(path, "rb") as f:
            f.seek(start)
            self._send(f.read(end - start + 1), "video/mp4", status, headers=headers)

    def get_preview(self, render_id: str) -> None:
        render = self.server.store.get_render(render_id)
        found = find_preview(self.server, render) if render else None
        data = None
        if found and found[0] == "path":
            data = found[1].read_bytes()
        elif found:
            data = self.server.blob_reader(found[1])
        if not data:
            self._json({"error": f"no preview for {render_id}"}, HTTPStatus.NOT_FOUND)
            return
        self._send(data, "image/png")

    def get_workers(self) -> None:
        self._json({"workers": metrics.list_workers(self.server.store)})

    def get_summary(self) -> None:
        self._json(metrics.farm_snapshot(self.server.store))

    def get_session(self) -> None:
        csrf, cookies = self._csrf_cookie()
        logged_in = self.server.token is not None and self._token_ok()
        self._json(
            {"actions_enabled": self.server.token is not None, "logged_in": logged_in, "csrf": csrf},
            cookies=cookies,
        )

    def get_time(self) -> None:
        self._json({"ms": metrics.redis_now_ms(self.server.store)})

    def get_metrics(self) -> None:
        self._send(metrics.prometheus_text(self.server.store), "text/plain; version=0.0.4; charset=utf-8")

    def get_health(self) -> None:
        self._json({"ok": True})

    # ------------------------------------------------------------------ server-sent events

    def _sse_start(self) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Accel-Buffering", "no")
        self.end_headers()
        self.wfile.write(b"retry: 2000\n: connected\n\n")
        self.wfile.flush()

    def _last_id(self, stream: str) -> str:
        newest = self.server.store.client.xrevrange(stream, count=1)
        return newest[0][0] if newest else "0"

    def _sse_loop(self, streams: dict[str, str], refresh: Callable[[dict[str, str]], None] | None) -> None:
        """XREAD BLOCK over `streams` (key -> last id) until the client leaves or the server stops."""
        client, store = self.server.store.client, self.server.store
        prefix = store.key("events", "")
        quiet_since = time.monotonic()
        self._sse_start()
        while not self.server.stopping.is_set():
            if refresh is not None:
                refresh(streams)
            resp = client.xread(streams, count=200, block=SSE_BLOCK_MS) if streams else None
            if not streams:
                self.server.stopping.wait(SSE_BLOCK_MS / 1000)
            entries = resp.items() if isinstance(resp, dict) else (resp or [])
            out = []
            for stream, items in entries:
                for eid, fields in items:
                    streams[stream] = eid
                    event = {"render": stream[len(prefix) :], "id": eid, **json.loads(fields["e"])}
                    out.append(f"id: {eid}\ndata: {json.dumps(event, default=str)}\n\n")
            if out:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= KEEPALIVE_S:
                out.append(": keepalive\n\n")
                quiet_since = time.monotonic()
            if out:
                self.wfile.write("".join(out).encode())
                self.wfile.flush()

    def get_render_events(self, render_id: str) -> None:
        """One render's events: from ?after=ID or Last-Event-ID, else only those emitted from now on."""
        stream = self.server.store.key("events", render_id)
        after = self.query.get("after") or self.headers.get("Last-Event-ID") or self._last_id(stream)
        self._sse_loop({stream: after}, None)

    def get_all_events(self) -> None:
        """Events of the newest renders; a render that appears later is followed from its first event."""
        store = self.server.store

        def refresh(streams: dict[str, str]) -> None:
            for rid in store.client.zrevrange(store.key("renders"), 0, ALL_EVENTS_RENDERS - 1):
                streams.setdefault(store.key("events", rid), "0")

        streams = {
            store.key("events", rid): self._last_id(store.key("events", rid))
            for rid in store.client.zrevrange(store.key("renders"), 0, ALL_EVENTS_RENDERS - 1)
        }
        self._sse_loop(streams, refresh)

    # ------------------------------------------------------------------ actions

    def _token_ok(self) -> bool:
        expected = self.server.token or ""
        auth = self.headers.get("Authorization", "")
        presented = auth[7:].strip() if auth.startswith("Bearer ") else self._cookies().get(TOKEN_COOKIE, "")
        return bool(expected) and hmac.compare_digest(presented.encode(), expected.encode())

    def _refusal(self, need_token: bool = True) -> str | None:
        """Why this POST must be refused (403), or None: read-only, token, CSRF, foreign origin."""
        if self.server.token is None:
            return "the dashboard is read-only (started without the farm token)"
        origin = self.headers.get("Origin")
        if origin and origin != "null" and urlsplit(origin).netloc != self.headers.get("Host", ""):
            return f"cross-origin request from {origin} refused"
        if need_token and not self._token_ok():
            return "missing or wrong farm token"
        cookie, header = self._cookies().get(CSRF_COOKIE, ""), self.headers.get(CSRF_HEADER, "")
        if not cookie or not header or not hmac.compare_digest(cookie.encode(), header.encode()):
            return "missing or mismatched CSRF token (send the farm_csrf cookie's value as X-CSRF-Token)"
        return None

    def _guard(self, need_token: bool = True) -> bool:
        why = self._refusal(need_token)
        if why:
            self._json({"error": why}, HTTPStatus.FORBIDDEN)
        return why is None

    def post_login(self) -> None:
        if not self._guard(need_token=False):
            return
        presented = str(self._body().get("token", "")).strip()
        if not hmac.compare_digest(presented.encode(), (self.server.token or "").encode()):
            self._json({"error": "wrong farm token"}, HTTPStatus.FORBIDDEN)
            return
        self._json({"ok": True}, cookies=[f"{TOKEN_COOKIE}={presented}; Path=/; HttpOnly; SameSite=Strict"])

    def post_logout(self) -> None:
        if self._guard(need_token=False):
            self._json(
                {"ok": True}, cookies=[f"{TOKEN_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"]
            )

    def post_cancel(self, render_id: str) -> None:
        if self._guard():
            self._json({"render": render_id, "cancelled": bool(self.server.store.cancel_render(render_id))})

    def post_drain(self, worker_id: str) -> None:
        """The workers table's drain button: the worker finishes its task, takes no other, and exits."""
        if self._guard():
            self._json({"worker": worker_id, "draining": bool(self.server.store.drain_worker(worker_id))})

    def post_priority(self, render_id: str) -> None:
        """Needs FarmStore.set_priority (one Lua script); answers 501 until the store has it."""
        if not self._guard():
            return
        setter = getattr(self.server.store, "set_priority", None)
        if setter is None:
            self._json(
                {"error": "this coordinator's store cannot change priority yet"}, HTTPStatus.NOT_IMPLEMENTED
            )
            return
        priority = int(self._body().get("priority", 0))
        self._json({"render": render_id, "priority": priority, "ok": bool(setter(render_id, priority))})

    def post_render_requeue(self, render_id: str) -> None:
        """Clear the render's blocklist (what `farm requeue RENDER` does)."""
        if self._guard():
            self._json({"render": render_id, "cleared": bool(self.server.store.clear_blocklist(render_id))})

    def post_requeue(self, task_id: str) -> None:
        """Needs FarmStore.requeue_task (one Lua script); answers 501 until the store has it."""
        if not self._guard():
            return
        requeue = getattr(self.server.store, "requeue_task", None)
        if requeue is None:
            self._json(
                {"error": "this coordinator's store cannot requeue tasks yet"}, HTTPStatus.NOT_IMPLEMENTED
            )
            return
        self._json({"task": task_id, "requeued": bool(requeue(task_id))})
