"""The film grows while it renders: the leader's loop that muxes each decoded window of a running chunked
render into its `partial.mp4` (`assemble/partial.py`), which `farm fetch --partial` downloads.

Each pass reads the newest renders' states, and for a running chunked one its tasks: the windows done
(`views/windows.py`) are what the film may hold. Everything it needs is in Redis and the data folder, so
a coordinator that restarts (or takes over) resumes the film at the window it reached.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from coordinator.assemble.partial import film_held, grow_film
from coordinator.leadership import PassLoop, check_epoch
from coordinator.results import as_dict
from coordinator.state.blobs import BlobStore
from coordinator.views.windows import decoded_windows, window_rows
from protos.states import RenderState

log = logging.getLogger("farm.growing")
SCAN_RENDERS = 200  # the newest renders looked at each pass
INTERVAL_S = 1.0


class GrowingStore(Protocol):
    """The store reads the film's loop makes (and the epoch check before it publishes)."""

    def newest_render_ids(self, limit: int) -> list[str]: ...

    def render_states(self, render_ids: list[str]) -> dict[str, str | None]: ...

    def get_render(self, render_id: str) -> dict | None: ...

    def render_tasks(self, render_id: str) -> list[dict]: ...


def _getter(blobs: BlobStore, render_id: str, tasks: list[dict]) -> Callable[[str, str], Any]:
    """Task outputs by (name in the plan, output), read from the blob store as the assembler reads them."""
    outputs = {str(t["id"]).removeprefix(f"{render_id}."): as_dict(t.get("outputs")) for t in tasks}

    def get(name: str, output: str) -> Any:
        sha = outputs.get(name, {}).get(output)
        if sha is None:
            return None
        return blobs.tensor_frames(sha) if output == "pixels" else blobs.read_tensor(sha)

    return get


def grow_render(store: GrowingStore, blobs: BlobStore, data_dir: Path, render_id: str,
                fence: Callable[[], None] | None = None) -> int:
    """The render's film brought up to its decoded windows; the windows it holds (0: not chunked)."""
    render = store.get_render(render_id)
    if render is None or not as_dict(render.get("spec")).get("chunked"):
        return 0
    render["spec"] = as_dict(render.get("spec"))
    tasks = store.render_tasks(render_id)
    decoded = decoded_windows(window_rows(render, tasks))
    out_dir = Path(data_dir) / "renders" / render_id
    if decoded <= film_held(out_dir):
        return film_held(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    held = grow_film(render["spec"], _getter(blobs, render_id, tasks), out_dir, decoded, fence)
    log.info("render %s: its film holds %d windows", render_id, held)
    return held


def grow_films(store: GrowingStore, blobs: BlobStore, data_dir: Path, fence: Callable[[], None] | None = None) -> int:
    """One pass over the newest running renders; how many windows were added to their films."""
    ids = store.newest_render_ids(SCAN_RENDERS)
    running = [rid for rid, state in store.render_states(ids).items() if state == RenderState.RUNNING]
    added = 0
    for render_id in running:
        before = film_held(Path(data_dir) / "renders" / render_id)
        added += max(0, grow_render(store, blobs, data_dir, render_id, fence) - before)
    return added


class FilmGrower(PassLoop):
    """The leader's film loop until stop(); a Redis blip or a blob read error only costs a pass."""

    def __init__(self, store: GrowingStore, blobs: BlobStore, data_dir: Path, interval_s: float = INTERVAL_S) -> None:
        super().__init__("farm-films", "growing films", log, interval_s)
        self.store, self.blobs, self.data_dir = store, blobs, Path(data_dir)

    def one_pass(self) -> None:
        grow_films(self.store, self.blobs, self.data_dir, fence=lambda: check_epoch(self.store))
