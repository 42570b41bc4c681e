"""The dashboard's routes and views: the page, its JSON API, the video and preview files, /metrics
and the actions. Starlette does the HTTP; RequestGuard (security.py) has already checked the Host
and read the body; `Farm` (context.py) carries what the views read (Redis is the truth: nothing is cached here).

Sync views run in Starlette's thread pool (the store is sync redis-py); the event streams are async
and live in events.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from coordinator.dashboard.context import Farm, Json, checked_id, error, farm_of
from coordinator.dashboard.events import all_events, render_events
from coordinator.dashboard.security import (
    BODY_KEY,
    CSRF_COOKIE,
    LOGIN_PARAM,
    SESSION_COOKIE,
    cookies_of,
    csrf_token,
    form_or_json,
)
from coordinator.views import fleet, metrics, prometheus, schedule
from protos.states import RETRYABLE, TERMINAL, RenderState

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATES = {"terminal": sorted(TERMINAL), "retryable": sorted(RETRYABLE)}  # the page reads these (/api/session)


def reader(view: Callable[[Request], Response]) -> Callable[[Request], Response]:
    """A view that shows farm data: only with the farm token (when the farm has one)."""

    def guarded(request: Request) -> Response:
        if not farm_of(request).gate.may_read(request.headers, cookies_of(request.headers.get("cookie", ""))):
            return error(401, "log in with the farm token")
        return view(request)

    guarded.__name__ = view.__name__
    guarded.__doc__ = view.__doc__
    return guarded


def action(need_token: bool = True) -> Callable:
    """A POST view: refused (403) unless the token, CSRF and origin checks pass (Gate.refusal)."""

    def wrap(view: Callable[[Request, dict], Response]) -> Callable[[Request], Response]:
        def guarded(request: Request) -> Response:
            why = farm_of(request).gate.refusal(request.headers, cookies_of(request.headers.get("cookie", "")),
                                                need_token)
            if why:
                return error(403, why)
            body = form_or_json(request.scope.get(BODY_KEY, b""), request.headers.get("content-type", ""))
            return view(request, body)

        guarded.__name__ = view.__name__
        return guarded

    return wrap


# ---------------------------------------------------------------------- pages and JSON


def index(request: Request) -> Response:
    """The page shell: no farm data in it, so it is served to anyone (it shows the login form). With
    `?token=` (the login link), the token is traded for the session cookie and the browser sent on to
    the clean URL, so the secret stays in neither the address bar nor the history; a wrong one lands on
    the page with the login form's inline error (`#login=failed`)."""
    if LOGIN_PARAM in request.query_params:
        return link_login(request, request.query_params[LOGIN_PARAM])
    response = HTMLResponse((STATIC_DIR / "index.html").read_bytes())
    value, fresh = csrf_token(cookies_of(request.headers.get("cookie", "")))
    if fresh:
        response.set_cookie(CSRF_COOKIE, value, path="/", samesite="strict")
    return response


def link_login(request: Request, token: str) -> Response:
    gate = farm_of(request).gate
    good = gate.enabled and gate.secret_matches(token.strip())
    response = RedirectResponse("/" if good or not gate.enabled else "/#login=failed", 303)
    if good:
        response.set_cookie(SESSION_COOKIE, gate.session_value(), path="/", httponly=True, samesite="strict")
    response.headers["referrer-policy"] = "no-referrer"
    return response


def session(request: Request) -> Response:
    """What the page needs to start: whether a token is needed, whether this browser is logged in,
    its CSRF token (minted on first visit), and the state vocabulary (protos/states.py), so the page
    keeps no list of its own of which renders have ended."""
    gate, cookies = farm_of(request).gate, cookies_of(request.headers.get("cookie", ""))
    value, fresh = csrf_token(cookies)
    logged_in = gate.token_ok(request.headers, cookies)
    response = Json({"actions_enabled": gate.enabled, "token_required": gate.enabled, "logged_in": logged_in,
                     "csrf": value, "states": STATES})
    if fresh:
        response.set_cookie(CSRF_COOKIE, value, path="/", samesite="strict")
    return response


def health(request: Request) -> Response:
    return Json({"ok": True})


def clock(request: Request) -> Response:
    """The coordinator's Redis clock (no farm data): `farm doctor --dashboard` measures skew with it."""
    return Json({"ms": metrics.redis_now_ms(farm_of(request).store)})


@reader
def renders(request: Request) -> Response:
    limit = max(1, min(int(request.query_params.get("limit", 50)), 500))
    return Json({"renders": metrics.list_summaries(farm_of(request).store, limit)})


@reader
def render(request: Request) -> Response:
    farm, render_id = farm_of(request), checked_id(request, "render_id")
    detail = metrics.render_detail(farm.store, render_id)
    if detail is None:
        return error(404, f"no render {render_id}")
    found = find_preview(farm, detail["render"])
    stamp = int(found[1].stat().st_mtime * 1000) if found and found[0] == "path" else 0
    detail["preview"] = f"/api/renders/{render_id}/preview.png?v={stamp}" if found else None
    detail["actions"] = farm.gate.enabled
    output = detail["render"].get("output")
    done = detail["render"].get("state") == RenderState.DONE and output and Path(output).is_file()
    detail["video"] = f"/api/renders/{render_id}/video.mp4" if done else None
    detail["schedule"] = schedule.render_schedule(farm.store, render_id)
    detail["feed"] = schedule.feed(farm.store, render_id)
    return Json(detail)


@reader
def farm_schedule(request: Request) -> Response:
    """The farm's Gantt over the last `minutes` (60 by default, at most a day) and its event feed."""
    minutes = max(1, min(int(request.query_params.get("minutes", schedule.FARM_WINDOW_MIN)), 1440))
    store = farm_of(request).store
    return Json({"schedule": schedule.farm_schedule(store, minutes), "feed": schedule.feed(store)})


def video(request: Request) -> Response:
    """The finished mp4 for the page's player and download link: only with the farm token (cookie or
    Bearer), from the path the coordinator itself recorded; Range requests let the player seek."""
    farm, render_id = farm_of(request), checked_id(request, "render_id")
    if not farm.gate.token_ok(request.headers, cookies_of(request.headers.get("cookie", ""))):
        return error(403, "log in with the farm token to play or download videos")
    record = farm.store.get_render(render_id) or {}
    path = Path(record.get("output") or "")
    if record.get("state") != RenderState.DONE or not path.is_file():
        return error(404, f"render {render_id} has no video")
    name = f"{render_id}.mp4" if request.query_params.get("download") else None
    return FileResponse(path, media_type="video/mp4", filename=name)


def find_preview(farm: Farm, record: dict) -> tuple[str, Any] | None:
    """Where the render's preview PNG is: ("path", Path) or ("blob", sha); None when there is none."""
    path = record.get("preview_path")
    if path and Path(path).is_file():
        return "path", Path(path)
    sha = record.get("preview_sha") or record.get("preview_blob")
    if sha and farm.blob_reader is not None:
        return "blob", sha
    if farm.data_dir is not None:
        candidate = farm.data_dir / "previews" / f"{record['id']}.png"
        if candidate.is_file():
            return "path", candidate
    return None


@reader
def preview(request: Request) -> Response:
    farm, render_id = farm_of(request), checked_id(request, "render_id")
    record = farm.store.get_render(render_id)
    found = find_preview(farm, record) if record else None
    data = None
    if found and found[0] == "path":
        data = found[1].read_bytes()
    elif found and farm.blob_reader is not None:
        data = farm.blob_reader(found[1])
    if not data:
        return error(404, f"no preview for {render_id}")
    return Response(data, media_type="image/png")


@reader
def workers(request: Request) -> Response:
    return Json({"workers": fleet.list_workers(farm_of(request).store)})


@reader
def summary(request: Request) -> Response:
    return Json(prometheus.farm_snapshot(farm_of(request).store))


@reader
def metrics_page(request: Request) -> Response:
    """Prometheus scrapes with `authorization: Bearer <secret>` (its scrape config's bearer token)."""
    return Response(prometheus.prometheus_text(farm_of(request).store),
                    media_type="text/plain; version=0.0.4; charset=utf-8")


# ---------------------------------------------------------------------- actions


@action(need_token=False)
def login(request: Request, body: dict) -> Response:
    """Trade the farm token (or its secret) for the session cookie, once per browser."""
    gate = farm_of(request).gate
    if not gate.secret_matches(str(body.get("token", "")).strip()):
        return error(403, "wrong farm token")
    response = Json({"ok": True})
    response.set_cookie(SESSION_COOKIE, gate.session_value(), path="/", httponly=True, samesite="strict")
    return response


@action(need_token=False)
def logout(request: Request, body: dict) -> Response:
    response = Json({"ok": True})
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


@action()
def cancel(request: Request, body: dict) -> Response:
    render_id = checked_id(request, "render_id")
    return Json({"render": render_id, "cancelled": bool(farm_of(request).store.cancel_render(render_id))})


@action()
def priority(request: Request, body: dict) -> Response:
    render_id, value = checked_id(request, "render_id"), int(body.get("priority", 0))
    if abs(value) > 1_000_000:
        raise ValueError("priority must be within ±1,000,000")
    return Json({"render": render_id, "priority": value,
                 "ok": bool(farm_of(request).store.set_priority(render_id, value))})


@action()
def render_requeue(request: Request, body: dict) -> Response:
    """Clear the render's blocklist (what `farm requeue RENDER` does)."""
    render_id = checked_id(request, "render_id")
    return Json({"render": render_id, "cleared": bool(farm_of(request).store.clear_blocklist(render_id))})


@action()
def render_retry(request: Request, body: dict) -> Response:
    """A failed or cancelled render runs again under its id; only its unfinished tasks run."""
    render_id = checked_id(request, "render_id")
    return Json({"render": render_id, "outcome": farm_of(request).store.retry_render(render_id)})


@action()
def task_requeue(request: Request, body: dict) -> Response:
    task_id = checked_id(request, "task_id")
    return Json({"task": task_id, "requeued": bool(farm_of(request).store.requeue_task(task_id))})


@action()
def drain(request: Request, body: dict) -> Response:
    """The workers table's drain button: the worker finishes its task, takes no other, and exits."""
    worker_id = checked_id(request, "worker_id")
    return Json({"worker": worker_id, "draining": bool(farm_of(request).store.drain_worker(worker_id))})


@action()
def resume(request: Request, body: dict) -> Response:
    """The resume button beside drain: a draining worker that has not left yet serves on."""
    worker_id = checked_id(request, "worker_id")
    return Json({"worker": worker_id, "resumed": bool(farm_of(request).store.resume_worker(worker_id))})


def _bad_request(request: Request, exc: Exception) -> Response:
    text = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return error(400, f"bad request: {text}")


def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error(exc.status_code, str(exc.detail)) if exc.status_code != 404 or exc.detail != "Not Found" \
        else error(404, f"no such page {request.url.path[:200]}")


def _internal(request: Request, exc: Exception) -> Response:
    if not farm_of(request).stopping.is_set():  # shutting down: Redis may already be gone
        log.error("dashboard %s %s failed", request.method, request.url.path[:200], exc_info=exc)
    return error(500, "internal error; the coordinator's log has the details")


def routes() -> list:
    get = ["GET", "HEAD"]
    return [
        Route("/", index, methods=get), Route("/index.html", index, methods=get),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
        Route("/healthz", health, methods=get), Route("/api/time", clock, methods=get),
        Route("/api/session", session, methods=get),
        Route("/api/renders", renders, methods=get),
        Route("/api/renders/{render_id}", render, methods=get),
        Route("/api/renders/{render_id}/events", render_events, methods=["GET"]),
        Route("/api/renders/{render_id}/preview.png", preview, methods=get),
        Route("/api/renders/{render_id}/video.mp4", video, methods=get),
        Route("/api/events", all_events, methods=["GET"]),
        Route("/api/workers", workers, methods=get),
        Route("/api/schedule", farm_schedule, methods=get),
        Route("/api/metrics-summary", summary, methods=get),
        Route("/metrics", metrics_page, methods=get),
        Route("/api/login", login, methods=["POST"]), Route("/api/logout", logout, methods=["POST"]),
        Route("/api/renders/{render_id}/cancel", cancel, methods=["POST"]),
        Route("/api/renders/{render_id}/priority", priority, methods=["POST"]),
        Route("/api/renders/{render_id}/requeue", render_requeue, methods=["POST"]),
        Route("/api/renders/{render_id}/retry", render_retry, methods=["POST"]),
        Route("/api/tasks/{task_id}/requeue", task_requeue, methods=["POST"]),
        Route("/api/workers/{worker_id}/drain", drain, methods=["POST"]),
        Route("/api/workers/{worker_id}/resume", resume, methods=["POST"]),
    ]


def build_app(farm: Farm) -> Starlette:
    """The Starlette app; the caller wraps it in RequestGuard. A wrong request is a 400 in one line,
    never a 500 with a traceback."""
    handlers: dict[Any, Callable] = {ValueError: _bad_request, KeyError: _bad_request, TypeError: _bad_request,
                                     ArithmeticError: _bad_request,  # int(1e309) in a body
                                     HTTPException: _http_error, Exception: _internal}
    app = Starlette(routes=routes(), exception_handlers=handlers)
    app.state.farm = farm
    return app
