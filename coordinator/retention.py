"""Retention: finished renders are forgotten after a while, and blobs no render references are
collected, so a farm's Redis and data folder do not grow forever.

A render that ended more than `older_than_s` ago loses its Redis keys (delete_render.lua), its
folder under DATA/renders and its preview. Then every blob that no remaining render names (task
inputs, outputs, the spec's image) and that is older than a grace period (an image uploaded for a
submit still on its way) is removed, record (forget_blob.lua) and file; workers unseen for a day that
hold no lease are forgotten (forget_workers.lua). The leading coordinator runs
`prune` every hour with the configured retention (FARM_RETENTION_DAYS, default 14).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from coordinator.leadership import LostEpoch
from coordinator.state.store import NotLeader
from protos.states import TERMINAL, Outcome

log = logging.getLogger(__name__)

DEFAULT_RETENTION_DAYS = 14.0
BLOB_GRACE_S = 3600.0
# The floor under any grace (`farm prune --older-than 0` included): a blob younger than this that no
# render names yet may be an upload on its way to a submit (an --image, sent before the Submit call).
FRESH_BLOB_FLOOR_S = 600.0
WORKER_GONE_S = 86400.0  # a worker record unseen this long (and holding no lease) is removed
SWEEP_EVERY_S = 3600.0


class RetentionStore(Protocol):
    """The store calls retention makes: what ended and when, and the deletions (Lua scripts)."""

    def list_renders(self, limit: int = 50) -> list[dict]: ...

    def render_tasks(self, render_id: str) -> list[dict]: ...

    def blob_shas(self) -> list[str]: ...

    def delete_render(self, render_id: str) -> str: ...

    def forget_workers(self, seen_before_ms: int) -> list[str]: ...

    def forget_blob(self, sha: str, created_before_ms: int) -> str | None: ...


@dataclass
class Pruned:
    renders: list[str] = field(default_factory=list)
    blobs: int = 0
    blob_bytes: int = 0
    workers: list[str] = field(default_factory=list)


def retention_days() -> float:
    """FARM_RETENTION_DAYS, else 14; a value that is not a positive number keeps the default."""
    try:
        days = float(os.environ.get("FARM_RETENTION_DAYS", DEFAULT_RETENTION_DAYS))
    except ValueError:
        return DEFAULT_RETENTION_DAYS
    return days if days > 0 else DEFAULT_RETENTION_DAYS


def forget_render(store: RetentionStore, data_dir: Path, render_id: str) -> str:
    """Delete a finished render's keys, folder and preview: 'deleted', 'missing' or its live state.
    The id is one of ours (it exists in Redis), so the paths stay inside the data folder."""
    result = store.delete_render(render_id)
    if result == Outcome.DELETED:
        data = Path(data_dir)
        folder = data / "renders" / render_id
        if folder.resolve().parent == (data / "renders").resolve():
            shutil.rmtree(folder, ignore_errors=True)
            (data / "previews" / f"{render_id}.png").unlink(missing_ok=True)
    return result


def lora_blobs(spec: object) -> set[str]:
    """The uploaded LoRA files a render's spec names: kept while the render is."""
    loras = spec.get("loras") if isinstance(spec, dict) else None
    return {str(x["blob"]) for x in loras or () if isinstance(x, dict) and isinstance(x.get("blob"), str)}


def _resume_blobs(resume: object) -> set[str]:
    """A gang stage 1's kept step ({"step", "blobs": {name: sha}}, JSON on the task): a re-lease
    resumes from these, so they live as long as the task does."""
    if isinstance(resume, str):
        with contextlib.suppress(ValueError):
            resume = json.loads(resume)
    blobs = resume.get("blobs") if isinstance(resume, dict) else None
    return {v for v in blobs.values() if isinstance(v, str)} if isinstance(blobs, dict) else set()


def referenced_blobs(tasks_by_render: Iterable[tuple[dict, list[dict]]]) -> set[str]:
    """Every sha a render still needs: task inputs ({"blob": sha}), outputs ({name: sha}), its images."""
    found: set[str] = set()
    for render, tasks in tasks_by_render:
        spec = render.get("spec") if isinstance(render.get("spec"), dict) else {}
        images = [spec.get("image"), *(spec.get("images") or [])]  # an older render's one image, or its keyframes
        found.update(im["blob"] for im in images if isinstance(im, dict) and isinstance(im.get("blob"), str))
        found.update(lora_blobs(render.get("spec")))
        for task in tasks:
            for ref in (task.get("inputs") or {}).values():
                if isinstance(ref, dict) and isinstance(ref.get("blob"), str):
                    found.add(ref["blob"])
            found.update(v for v in (task.get("outputs") or {}).values() if isinstance(v, str))
            found.update(_resume_blobs(task.get("resume")))
    return found


def prune(store: RetentionStore, data_dir: Path, older_than_s: float, now_ms: int, blob_grace_s: float = BLOB_GRACE_S) -> Pruned:
    """Forget renders that ended before now - older_than_s, then collect unreferenced blobs older than
    blob_grace_s: those of the renders just forgotten at that age, any other (one no render names, maybe
    an upload on its way to a submit) never younger than FRESH_BLOB_FLOOR_S, whatever the caller asks."""
    done = Pruned()
    cutoff = now_ms - older_than_s * 1000
    remaining: list[tuple[dict, list[dict]]] = []
    forgotten: list[tuple[dict, list[dict]]] = []
    for render in store.list_renders(limit=1 << 30):
        ended = int(render.get("finished_ms") or render.get("created_ms") or 0)
        tasks = store.render_tasks(str(render["id"]))
        if render.get("state") in TERMINAL and ended <= cutoff:
            if forget_render(store, data_dir, str(render["id"])) == Outcome.DELETED:
                done.renders.append(str(render["id"]))
                forgotten.append((render, tasks))
                continue
        remaining.append((render, tasks))
    done.workers = store.forget_workers(int(now_ms - WORKER_GONE_S * 1000))
    keep, freed = referenced_blobs(remaining), referenced_blobs(forgotten)
    freed_cutoff = int(now_ms - blob_grace_s * 1000)
    fresh_cutoff = int(now_ms - max(blob_grace_s, FRESH_BLOB_FLOOR_S) * 1000)
    for sha in store.blob_shas():
        if sha in keep:
            continue
        path = store.forget_blob(sha, freed_cutoff if sha in freed else fresh_cutoff)
        if path:
            done.blobs += 1
            with contextlib.suppress(OSError):  # a file already gone is fine: its record was the truth
                done.blob_bytes += Path(path).stat().st_size
                Path(path).unlink()
    return done


def start_sweeper(store: RetentionStore, data_dir: Path, leading: Callable[[], bool], now_ms: Callable[[], int],
                  stop: threading.Event, every_s: float = SWEEP_EVERY_S) -> threading.Thread:
    """Prune every `every_s` while this coordinator leads; a failure is logged and tried next time."""

    def loop() -> None:
        deposed = LostEpoch("retention", log)
        while not stop.wait(every_s):
            if not leading():
                continue
            try:
                result = prune(store, data_dir, retention_days() * 86400, now_ms())
                deposed.ok()
            except NotLeader as exc:
                deposed.note(exc)
                continue
            except Exception:  # noqa: BLE001 - retention waits for the next sweep, the farm goes on
                log.exception("retention sweep failed; trying again in %.0f s", every_s)
                continue
            if result.renders or result.blobs:
                log.info("retention: forgot %d renders, %d blobs (%.1f MB)", len(result.renders), result.blobs,
                         result.blob_bytes / 1e6)

    thread = threading.Thread(target=loop, name="retention", daemon=True)
    thread.start()
    return thread
