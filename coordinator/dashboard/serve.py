"""Run the dashboard's ASGI app with uvicorn in a daemon thread of the coordinator process.

Why a thread of our own socket: the coordinator (and `farm up`) start the dashboard beside the gRPC
server and must know the bound port at once (port 0 picks a free one) and fail in their own thread
when the port is taken. uvicorn's h11 protocol gets one more limit here: a connection must deliver
each request's line and headers within the request timeout (uvicorn bounds only the idle time between
requests), so a stalled client holds no more than a socket, and that not for long.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from coordinator.dashboard.app import build_app
from coordinator.dashboard.context import BlobReader, DashboardStore, Farm
from coordinator.dashboard.security import REQUEST_TIMEOUT_S, Gate, RequestGuard
from protos.defaults import DASHBOARD_PORT

log = logging.getLogger(__name__)


class _TimedH11(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose next request's head has not arrived within
    `head_timeout_s` of the connection opening or the last answer."""

    def __init__(self, *args: Any, head_timeout_s: float = REQUEST_TIMEOUT_S, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timeout_s = head_timeout_s

    def _arm(self) -> None:
        waiting_after = self.cycle  # still this cycle when the timer fires: no new request has started

        def expire() -> None:
            if self.cycle is waiting_after and not self.transport.is_closing():
                self.transport.close()

        self.loop.call_later(self._head_timeout_s, expire)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def send_400_response(self, msg: str) -> None:
        """uvicorn answers bytes it cannot parse (a bad chunk after a good head) with a 400 of its own,
        even while the app already runs for that request; the app's answer would then fail inside h11
        and be logged as a crash. Tell the app its client is gone, and never answer twice."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:  # the app's answer is on the wire: a 400 cannot follow it
                self.transport.close()
                return
        try:
            super().send_400_response(msg)
        except h11.LocalProtocolError:  # e.g. a HEAD request, whose answer h11 allows no body
            self.transport.close()


@dataclass
class DashboardServer:
    """A running dashboard: its uvicorn server, thread, bound address and the views' Farm."""

    uvicorn: uvicorn.Server
    thread: threading.Thread
    server_address: tuple[str, int]
    farm: Farm


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart is not refused by TIME_WAIT
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def start_dashboard(
    store: DashboardStore,
    host: str = "127.0.0.1",
    port: int = DASHBOARD_PORT,
    token: str | None = None,
    blob_reader: BlobReader | None = None,
    data_dir: Path | None = None,
    token_file: Path | None = None,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
) -> tuple[DashboardServer, int]:
    """Serve the dashboard from a daemon thread; returns (server, bound port). Port 0 picks a free one.
    Given the token file the token came from, the dashboard follows it through `farm token rotate`."""
    farm = Farm(store, Gate(token, token_file), blob_reader, Path(data_dir) if data_dir else None)
    sock = _listen(host, port)
    bound = sock.getsockname()[1]
    app = RequestGuard(build_app(farm), bound_host=host, timeout_s=request_timeout_s)
    protocol = functools.partial(_TimedH11, head_timeout_s=request_timeout_s)  # uvicorn calls it per connection
    config = uvicorn.Config(app, http=protocol,  # type: ignore[arg-type]
                            ws="none", lifespan="off", log_config=None, log_level="warning", access_log=False,
                            timeout_keep_alive=5, timeout_graceful_shutdown=3, server_header=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="farm-dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        sock.close()
        raise RuntimeError(f"the dashboard did not start on {host}:{bound}")
    log.info("dashboard on http://%s:%d/ (%s)", host, bound,
             "reads and actions need the farm token" if token else "open and read-only: no farm token")
    return DashboardServer(server, thread, (host, bound), farm), bound


def stop_dashboard(server: DashboardServer) -> None:
    """End the event streams (within one poll), stop accepting, close the socket and join the thread."""
    server.farm.stopping.set()
    server.uvicorn.should_exit = True
    server.thread.join(timeout=10)
    if server.thread.is_alive():
        log.warning("dashboard thread still running after 10 s; leaving it (daemon)")
