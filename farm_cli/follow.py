"""Riding through coordinator outages: `farm submit --wait`, `farm watch` and fetching the result keep
going while the coordinator restarts, fails over to a standby, or loses Redis for a moment.

The render goes on without its client, so a client that loses the coordinator says so once, retries
with a backoff capped at a few seconds (following the leader through FarmClient), and resumes the
event stream after the last event it saw (WatchRequest.after_event_id), so no event is shown twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc
import typer

from farm_cli.client import CoordinatorUnreachable, FarmClient, FarmError
from protos.retry import Backoff

T = TypeVar("T")
RECONNECT_MAX_S = 2.0
RIDE_THROUGH_S = 3600.0  # give up (exit 1) after an outage this long
# What a coordinator going away looks like from a call in flight: refused or dropped connections, a
# stream cut by a stopping server, a Redis error surfacing through a servicer.
TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN,
                       grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED})


def transient(exc: FarmError) -> bool:
    return isinstance(exc, CoordinatorUnreachable) or exc.code in TRANSIENT


class Outage:
    """Backoff (the farm's one Backoff) and the one line a client prints per outage."""

    def __init__(self, limit_s: float = RIDE_THROUGH_S) -> None:
        self.limit_s = limit_s
        self.since: float | None = None
        self.backoff = Backoff(first_s=0.25, max_s=RECONNECT_MAX_S)

    def away(self, exc: FarmError) -> None:
        """Note a failed attempt and sleep before the next; re-raise once the outage is too long."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
            typer.echo(f"farm: lost the coordinator ({exc}); reconnecting…", err=True)
        elif now - self.since > self.limit_s:
            raise exc
        time.sleep(self.backoff.delay())

    def back(self) -> None:
        self.since = None
        self.backoff.reset()


def ride(op: Callable[[], T], outage: Outage) -> T:
    """op() until it answers, through transient failures; a real refusal is raised at once."""
    while True:
        try:
            result = op()
        except FarmError as exc:
            if not transient(exc):
                raise
            outage.away(exc)
            continue
        outage.back()
        return result


def follow_events(farm: FarmClient, render_id: str, outage: Outage) -> Iterator[dict]:
    """The render's events until it ends, resuming after the last one seen whenever the stream breaks."""
    last = "0"
    while True:
        try:
            for event in farm.watch(render_id, after=last):
                outage.back()
                last = str(event.get("_id") or last)
                yield event
            return
        except FarmError as exc:
            if not transient(exc):
                raise
            outage.away(exc)
