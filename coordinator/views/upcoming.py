"""Which ready task each busy worker should warm its cache for (FarmWorker.Upcoming).

The guess is the task the worker's lease would take now (lease.lua run as a peek: its placement rules,
not the head of the queue, which a worker may not be allowed or meant to take). Every worker asking
"what comes next?" would otherwise be told the same task, so with N workers N-1 of them fetch inputs for
a tile someone else will run: each guess is handed out once, the peek stepping over the tasks other
workers were told of in the last GUESS_TTL_S. A hint only — kept in this process, lost with it, never
consulted by a lease.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

GUESS_TTL_S = 30.0  # a guess older than this is free again (its worker died, or its forward is very long)


class UpcomingGuesses:
    """task id -> (worker, when it was told); one guess per worker."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._told: dict[str, tuple[str, float]] = {}

    def others(self, worker: str) -> list[str]:
        """The tasks other workers hold a live guess on: this worker's guess steps over them."""
        now = self._clock()
        with self._lock:
            return [tid for tid, (w, at) in self._told.items() if w != worker and now - at < GUESS_TTL_S]

    def pick(self, worker: str, candidates: list[tuple[str, list[str]]]) -> list[str]:
        """The input shas of the first candidate no other worker holds a live guess on ([] if none);
        the worker's earlier guess is released."""
        now = self._clock()
        with self._lock:
            self._told = {tid: (w, at) for tid, (w, at) in self._told.items()
                          if w != worker and now - at < GUESS_TTL_S}
            for tid, shas in candidates:
                if tid not in self._told:
                    self._told[tid] = (worker, now)
                    return shas
        return []
