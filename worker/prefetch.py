"""Warm the blob cache with the next task's inputs while the current task's forward runs.

A tile's inputs are ready on the coordinator the moment its step was cut, but a worker learns which tile
is its next only when its current result commits (the next lease rides on Complete). Fetching then
puts a transfer between every two forwards. Instead, once a forward starts, the agent asks the
coordinator which blobs the task it would lease next needs (FarmWorker.Upcoming, a guess read off the
ready queue that leases nothing) and fetches them into its cache in the background; when the lease
comes, its inputs are local. A wrong guess (another worker took that tile) costs only bandwidth.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import grpc

from protos import farm_pb2
from worker import quiet

log = logging.getLogger("farm.worker")

UPCOMING_TIMEOUT_S = 5.0
MAX_PREFETCH = 8  # blobs per forward: a tile has a handful of inputs


class Prefetcher:
    """One background warm-up at a time; fetch_inputs waits for an in-flight blob instead of fetching it
    a second time."""

    def __init__(self, ask: Callable[[farm_pb2.LeaseRequest], farm_pb2.UpcomingReply],
                 fetch: Callable[[str], object], cached: Callable[[str], bool]) -> None:
        self._ask, self._fetch, self._cached = ask, fetch, cached
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self._thread: threading.Thread | None = None

    def start(self, request: farm_pb2.LeaseRequest) -> None:
        """Warm the cache for the task this worker would lease next; returns at once."""
        if self._thread is not None and self._thread.is_alive():
            return  # the last warm-up is still moving bytes: don't pile up a second
        self._thread = threading.Thread(target=self._warm, args=(request,), name="prefetch", daemon=True)
        self._thread.start()

    def _warm(self, request: farm_pb2.LeaseRequest) -> None:
        quiet.background()  # it runs beside a forward: only the next lease has to find its blobs
        try:
            shas = list(self._ask(request).shas)[:MAX_PREFETCH]
        except grpc.RpcError as exc:  # an older coordinator (UNIMPLEMENTED) or a blip: no warm-up, no harm
            log.debug("upcoming: %s", exc.code())
            return
        with self._lock:  # every blob of the guess in flight at once: a lease settling meanwhile waits for all
            todo = {sha: threading.Event() for sha in dict.fromkeys(shas)
                    if sha not in self._inflight and not self._cached(sha)}
            self._inflight.update(todo)
        for sha, done in todo.items():
            try:
                self._fetch(sha)
            except Exception as exc:  # noqa: BLE001 - a guess that failed; the lease fetches for real
                log.debug("prefetch of %s: %s", sha[:12], exc)
            finally:
                with self._lock:
                    self._inflight.pop(sha, None)
                done.set()

    def settle(self, shas: Iterable[str], timeout: float = 60.0) -> None:
        """Wait for the in-flight warm-ups of these blobs (then they are cache hits)."""
        with self._lock:
            waits = [self._inflight[s] for s in set(shas) if s in self._inflight]
        for event in waits:
            event.wait(timeout)

    def wait(self, timeout: float) -> bool:
        """Wait for the warm-up in progress to end; True when none is running any more."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()
