"""What every dashboard view and stream reaches: the `Farm` they read, and the answers they share
(JSON errors, checked ids). Its own module so that the views (app.py) and the event streams
(events.py) both import it and neither imports the other.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from coordinator.dashboard.security import Gate
from coordinator.views.prometheus import SnapshotStore
from coordinator.views.schedule import ScheduleStore

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,200}")
BlobReader = Callable[[str], bytes | None]


class DashboardStore(SnapshotStore, ScheduleStore, Protocol):
    """What the dashboard asks of the store: the farm's numbers and /metrics' reads, the event
    streams the page follows, the schedule and feed (schedule.py), and the actions its buttons take (each one Lua script)."""

    def read_event_streams(self, positions: dict[str, str], block_ms: int = 0,
                           count: int = 200) -> dict[str, list[tuple[str, dict]]]: ...

    def newest_event_id(self, render_id: str) -> str: ...

    def newest_render_ids(self, limit: int) -> list[str]: ...

    def cancel_render(self, render_id: str) -> bool: ...

    def set_priority(self, render_id: str, priority: int) -> bool: ...

    def clear_blocklist(self, render_id: str) -> bool: ...

    def retry_render(self, render_id: str) -> str: ...

    def requeue_task(self, task_id: str) -> bool: ...

    def drain_worker(self, worker_id: str) -> bool: ...

    def resume_worker(self, worker_id: str) -> bool: ...


@dataclass
class Farm:
    """What the views need: the store, the gate, where previews live, and the stop flag for streams."""

    store: DashboardStore
    gate: Gate
    blob_reader: BlobReader | None = None
    data_dir: Path | None = None
    stopping: threading.Event = field(default_factory=threading.Event)


class Json(JSONResponse):
    """JSON whose odd values (bytes, paths) are written as strings rather than failing the answer."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, default=str).encode()


def error(status: int, message: str) -> Json:
    return Json({"error": message}, status)


def farm_of(request: Request) -> Farm:
    return request.app.state.farm


def checked_id(request: Request, name: str) -> str:
    """A render/task/worker id from the path, refused (404) unless it has the shape ids have."""
    value = request.path_params[name]
    if not _ID.fullmatch(value):
        raise HTTPException(404, f"no such id {value[:80]!r}")
    return value
