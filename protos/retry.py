"""Retries with bounded backoff for errors that end by themselves, logged once per outage.

The one retry helper of the farm: every coordinator loop (lease expiry, reducer, assembly, event relays)
and the worker's result uploads go through it, so a Redis restart or a dropped connection costs a pause
and two log lines (when it starts, when it ends), never a dead thread or a log line per attempt.
It imports neither redis nor grpc: callers say what is transient (workers never import redis).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
Transient = Callable[[BaseException], bool]


def describe(exc: BaseException) -> str:
    """One line: the error's type and the first line of its text; a gRPC error as its status code and
    details (its str() is a many-line repr whose first line says nothing)."""
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):
        status = getattr(code(), "name", None) or str(code())
        text = (details() or "").strip().splitlines()
        return f"{status}: {text[0]}" if text else str(status)
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Outage:
    """One activity's outage: the first failure logs a warning, the first success after it one info line."""

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what, self.log = what, log
        self.since: float | None = None
        self.attempts = 0
        self._lock = threading.Lock()  # one Outage may be shared by threads (the RPC handlers)

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            self.attempts += 1
            if self.since is not None:
                return
            self.since = time.monotonic()
        self.log.warning("%s: %s; retrying until it is back", self.what, describe(exc))

    def ok(self) -> bool:
        """Mark success; True when this ended an outage."""
        if self.since is None:  # the common case, without the lock
            return False
        with self._lock:
            if self.since is None:
                return False
            since, attempts = self.since, self.attempts
            self.since, self.attempts = None, 0
        self.log.info("%s: back after %.1f s (%d retries)", self.what, time.monotonic() - since, attempts)
        return True


class Backoff:
    """Delays that double from first_s up to max_s; reset() after a success."""

    def __init__(self, first_s: float = 0.1, max_s: float = 2.0) -> None:
        self.first_s, self.max_s = first_s, max_s
        self.next_s = first_s

    def delay(self) -> float:
        d = self.next_s
        self.next_s = min(self.next_s * 2, self.max_s)
        return d

    def reset(self) -> None:
        self.next_s = self.first_s


class GaveUp(Exception):
    """retry() stopped (its stop event was set, or give_up_s passed) while the error lasted."""


def retry(fn: Callable[[], T], what: str, *, transient: Transient, log: logging.Logger,
          stop: threading.Event | None = None, max_delay_s: float = 2.0, give_up_s: float | None = None) -> T:
    """fn() until it returns. Transient errors wait (bounded backoff) and try again, logged once per
    outage; any other error is raised at once. GaveUp (from the last error) once `stop` is set or
    `give_up_s` has passed — a state change that must land uses neither."""
    outage, backoff = Outage(what, log), Backoff(max_s=max_delay_s)
    start = time.monotonic()
    while True:
        try:
            result = fn()
        except Exception as exc:
            if not transient(exc):
                raise
            outage.failed(exc)
            over = give_up_s is not None and time.monotonic() - start >= give_up_s
            if over or (stop is not None and stop.is_set()):
                raise GaveUp(f"{what}: {describe(exc)}") from exc
            if stop is not None:
                stop.wait(backoff.delay())
            else:
                time.sleep(backoff.delay())
            continue
        outage.ok()
        return result
