"""Live Server-Sent Events for the page: one render's events, or those of the newest renders.

Why polling: each stream reads Redis with a non-blocking XREAD every POLL_S in a worker thread, so an
open page holds no thread between reads (a blocking XREAD would pin one thread of the shared pool per
browser tab, and forty tabs would starve every other view). The page only re-fetches on an event,
so half a second of delay is not seen.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from coordinator.dashboard.context import Farm, checked_id, error, farm_of
from coordinator.dashboard.security import cookies_of

POLL_S = 0.5  # also how fast a stream notices shutdown
KEEPALIVE_S = 10.0  # an SSE comment this often keeps proxies and browsers from timing out
ALL_EVENTS_RENDERS = 50  # /api/events follows the newest this many renders
Refresh = Callable[[dict[str, str]], None]


def _stream(request: Request, streams: Callable[[], dict[str, str]], refresh: Refresh | None) -> Response:
    farm = farm_of(request)
    if not farm.gate.may_read(request.headers, cookies_of(request.headers.get("cookie", ""))):
        return error(401, "log in with the farm token")
    return StreamingResponse(_relay(farm, streams, refresh), media_type="text/event-stream",
                             headers={"X-Accel-Buffering": "no"})


async def _relay(farm: Farm, start: Callable[[], dict[str, str]], refresh: Refresh | None) -> AsyncIterator[str]:
    """Events as SSE frames until the client leaves (Starlette cancels us) or the dashboard stops.
    positions: render id -> the last event id sent (store.read_event_streams reads them all at once)."""
    positions = await anyio.to_thread.run_sync(start)
    yield "retry: 2000\n: connected\n\n"
    quiet_since = time.monotonic()

    def read() -> dict[str, list[tuple[str, dict]]]:
        if refresh is not None:
            refresh(positions)
        return farm.store.read_event_streams(positions) if positions else {}

    while not farm.stopping.is_set():
        out = []
        for render_id, events in (await anyio.to_thread.run_sync(read)).items():
            for eid, event in events:
                positions[render_id] = eid
                out.append(f"id: {eid}\ndata: {json.dumps({'render': render_id, 'id': eid, **event}, default=str)}\n\n")
        if out:
            quiet_since = time.monotonic()
            yield "".join(out)
        elif time.monotonic() - quiet_since >= KEEPALIVE_S:
            quiet_since = time.monotonic()
            yield ": keepalive\n\n"
        else:
            await anyio.sleep(POLL_S)


def _newest(farm: Farm, render_id: str) -> str:
    return farm.store.newest_event_id(render_id)


async def render_events(request: Request) -> Response:
    """One render's events: from ?after=ID or Last-Event-ID, else only those emitted from now on."""
    farm, render_id = farm_of(request), checked_id(request, "render_id")
    after = request.query_params.get("after") or request.headers.get("last-event-id")
    if after is not None and not _valid_id(after):
        return error(400, "after / Last-Event-ID must be a stream id like 1700000000000-0")
    return _stream(request, lambda: {render_id: after or _newest(farm, render_id)}, None)


def _valid_id(value: str) -> bool:
    head, _, tail = value.partition("-")
    return head.isdigit() and (not tail or tail.isdigit()) and len(value) < 45


async def all_events(request: Request) -> Response:
    """Events of the newest renders; a render that appears later is followed from its first event."""
    farm = farm_of(request)
    store = farm.store

    def newest_renders() -> list[str]:
        return store.newest_render_ids(ALL_EVENTS_RENDERS)

    def start() -> dict[str, str]:
        return {rid: _newest(farm, rid) for rid in newest_renders()}

    def refresh(positions: dict[str, str]) -> None:
        for rid in newest_renders():
            positions.setdefault(rid, "0")

    return _stream(request, start, refresh)
