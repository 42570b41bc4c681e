"""One reader of render events for every Watch stream: the fan-out that lets 500 watchers cost one
Redis read, not 500.

Each Watch used to run its own blocking XREAD loop (a Redis connection and a wake-up per second per
watcher). The hub's single thread reads the streams of every watched render in one XREAD, checks
the states of renders that announced a change, encodes each event once, and hands each batch to the
watchers' own queues; a Watch handler only waits on its queue and sends the bytes it is given. A watcher reads its backlog itself once (from the event id
it asked for) and drops what it already has by id, so a join never loses or repeats an event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Collection, Iterator
from typing import Any, Protocol

import grpc

from protos.states import TERMINAL

log = logging.getLogger(__name__)

WATCH_LIMIT = 1024  # concurrent Watch streams (each waits on the hub in a thread of its own)
WATCH_JOINS = 16  # watchers reading their backlog at once (the rest wait: Redis connections are bounded)
WATCH_IDLE_S = 5.0  # a waiting watcher wakes this often to look for a Redis outage (a client leaving wakes it)
WATCH_OUTAGE_S = 60.0  # a Watch waits this long for Redis before it ends UNAVAILABLE (clients reconnect)

BLOCK_MS = 1_000
STATE_CHECK_S = 1.0  # a render that ends without an event of its own is noticed within this
END = object()  # the render ended (or is gone) and every event before the end was delivered
RETRY_S = (0.2, 0.5, 1.0, 2.0)
# The hub reads and delivers at most once per interval: DELIVER_EVERY_S, or longer for a crowd, so that
# all watchers together cost at most SENDS_PER_S sends (one EventBatch each over WatchBatches): 500
# watchers hear every ~3 s, and the workers' RPCs keep their latency; a few watchers (a person, a
# script waiting on a lease) hear each event within ~50 ms. A delivery wakes its watchers'
# threads PUSH_CHUNK at a time spread over PUSH_SPREAD of the interval, so a worker RPC arriving meanwhile
# waits behind a few of them (for the GIL and the server's completion queue), not behind all at once.
DELIVER_EVERY_S = 0.05
SENDS_PER_S = 150.0
PUSH_CHUNK = 16
PUSH_SPREAD = 0.8


class EventStore(Protocol):
    """The store reads the Watch hub uses: event pages, one blocking read of many streams, states."""

    def read_events(self, render_id: str, last_id: str = "0", block_ms: int = 0,
                    count: int = 200) -> list[tuple[str, dict]]: ...

    def read_event_streams(self, positions: dict[str, str], block_ms: int = 0,
                           count: int = 200) -> dict[str, list[tuple[str, dict]]]: ...

    def render_states(self, render_ids: list[str]) -> dict[str, str | None]: ...


def backlog(store: EventStore, render_id: str, after: str, count: int = 200) -> list[tuple[str, dict]]:
    """Every event of the render after `after`, however many (read in pages)."""
    out: list[tuple[str, dict]] = []
    while True:
        page = store.read_events(render_id, last_id=after, count=count)
        out += page
        if len(page) < count:
            return out
        after = page[-1][0]


def event_key(event_id: str) -> tuple[int, int]:
    """Stream ids `ms-seq` in their order ('0' sorts first)."""
    ms, _, seq = str(event_id).partition("-")
    return int(ms or 0), int(seq or 0)


class Subscription:
    """One watcher's queue of (event id, event) batches, filled by the hub, emptied by its handler."""

    def __init__(self, render_id: str, after: str) -> None:
        self.render_id, self.last = render_id, event_key(after)
        self._batches: deque = deque()
        self._ready = threading.Condition()

    def push(self, batch: Any) -> None:
        with self._ready:
            self._batches.append(batch)
            self._ready.notify()

    def take(self, timeout: float) -> list:
        """Everything queued so far (waits up to timeout for the first)."""
        with self._ready:
            if not self._batches:
                self._ready.wait(timeout)
            out = list(self._batches)
            self._batches.clear()
            return out

    def fresh(self, events: list[tuple[str, dict]]) -> Iterator[tuple[str, dict]]:
        """The events newer than the last one this watcher was given, in order."""
        for event_id, event in events:
            key = event_key(event_id)
            if key > self.last:
                self.last = key
                yield event_id, event


class WatchHub:
    """The fan-out: subscribe() a watcher, iterate events(), unsubscribe() when it leaves."""

    def __init__(self, store: EventStore, terminal: Collection[str] = TERMINAL, block_ms: int = BLOCK_MS,
                 encode: Callable[[str, str, dict], Any] = lambda _rid, _eid, event: event,
                 deliver_every_s: float = DELIVER_EVERY_S) -> None:
        self.store, self.terminal, self.block_ms, self.encode = store, frozenset(terminal), block_ms, encode
        self.deliver_every_s = deliver_every_s
        self._subs: dict[str, set[Subscription]] = defaultdict(set)
        self._position: dict[str, str] = {}  # the last event id the hub read per watched render
        self._check: set[str] = set()  # renders whose state the next round reads (new watchers)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self.stopping = threading.Event()
        self.outage_since: float | None = None
        self._thread: threading.Thread | None = None

    def watchers(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._subs.values())

    def subscribe(self, render_id: str, after: str) -> Subscription:
        """Register first, then read the backlog: the union of the two has no gap (duplicates drop by id)."""
        sub = Subscription(render_id, after)
        with self._lock:
            if render_id not in self._subs or not self._subs[render_id]:
                self._position.setdefault(render_id, after or "0")
            self._subs[render_id].add(sub)
            self._check.add(render_id)  # a render that already ended is answered at once
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="watch-hub", daemon=True)
                self._thread.start()
        self._wake.set()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.render_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[sub.render_id]
                    self._position.pop(sub.render_id, None)

    def stop(self) -> None:
        self.stopping.set()
        self._wake.set()

    # ------------------------------------------------------------------ the reader thread

    def _run(self) -> None:
        last_check, failures = 0.0, 0
        while not self.stopping.is_set():
            with self._lock:
                positions, check = dict(self._position), set(self._check)
                self._check.clear()
            if not positions:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            try:
                batches = self.store.read_event_streams(positions, block_ms=self.block_ms)
                changed = check | {rid for rid, events in batches.items()
                                   if any(str(e.get("type", "")).startswith("render") for _, e in events)}
                if time.monotonic() - last_check >= STATE_CHECK_S:
                    changed, last_check = set(positions), time.monotonic()
                states = self.store.render_states(sorted(changed)) if changed else {}
                started = time.monotonic()
                interval = self._deliver(batches, states)
                self.outage_since, failures = None, 0
                if batches:
                    self.stopping.wait(max(0.0, interval - (time.monotonic() - started)))
            except Exception as exc:  # noqa: BLE001 - a Redis blip pauses every watcher; they keep their streams
                if self.outage_since is None:
                    self.outage_since = time.monotonic()
                    log.warning("watch hub: reading events failed (%s); retrying", exc)
                self.stopping.wait(RETRY_S[min(failures, len(RETRY_S) - 1)])
                failures += 1

    def _deliver(self, batches: dict[str, list[tuple[str, dict]]], states: dict[str, str | None]) -> float:
        """Hand the batches (and END to the watchers of renders that ended) out; the interval to keep."""
        ended = {rid for rid, state in states.items() if state is None or state in self.terminal}
        tails = {rid: backlog(self.store, rid, batches[rid][-1][0] if batches.get(rid) else self._position.get(rid, "0"))
                 for rid in ended}  # the rest of an ended render's events (past the read's page, or written since)
        plan = []
        with self._lock:
            for rid in set(batches) | ended:
                events = batches.get(rid, []) + tails.get(rid, [])
                if events and rid in self._position:
                    self._position[rid] = events[-1][0]
                plan.append((rid, list(self._subs.get(rid, ())), events, rid in ended))
                if rid in ended:
                    self._subs.pop(rid, None)
                    self._position.pop(rid, None)
        pushes = []
        for rid, subs, events, end in plan:
            encoded = [(event_id, self.encode(rid, event_id, event)) for event_id, event in events]
            pushes += [(sub, encoded, end) for sub in subs]
        interval = max(self.deliver_every_s, len(pushes) / SENDS_PER_S)
        pause = PUSH_SPREAD * interval / -(-len(pushes) // PUSH_CHUNK) if len(pushes) > PUSH_CHUNK else 0.0
        for i, (sub, encoded, end) in enumerate(pushes):
            if encoded:
                sub.push(encoded)
            if end:
                sub.push(END)
            if pause and i % PUSH_CHUNK == PUSH_CHUNK - 1:
                time.sleep(pause)
        return interval


def encoded_batches(events: list[bytes], most: int = 500) -> Iterator[bytes]:
    """EventBatch wire bytes from encoded Events (field 1, length-delimited, repeated): no re-encoding."""
    for start in range(0, len(events), most):
        yield b"".join(b"\x0a" + _varint(len(e)) + e for e in events[start:start + most])


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class WatchRelay:
    """What the Watch RPCs run: admission (a limit in all and half of it per client address,
    RESOURCE_EXHAUSTED beyond, and the client polls instead) and one watcher's relay: its backlog, then
    the hub's deliveries (lists of encoded events), until the hub says the render ended."""

    def __init__(self, store: EventStore, hub: WatchHub, limit: int = WATCH_LIMIT) -> None:
        self.store, self.hub, self.limit, self.per_peer = store, hub, limit, max(1, limit // 2)
        self._watching: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._joining = threading.BoundedSemaphore(WATCH_JOINS)

    def deliveries(self, request: Any, context: Any, known: Callable[[str, Any], object]) -> Iterator[list]:
        """known(render_id, context) aborts NOT_FOUND for a render that does not exist."""
        peer = context.peer().rsplit(":", 1)[0]  # the client's address without its port
        with self._lock:
            total = sum(self._watching.values())
            if total >= self.limit or self._watching[peer] >= self.per_peer:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"the coordinator relays {total} watchers ({self._watching[peer]} from this "
                              "address) already; poll the render, or retry")
            self._watching[peer] += 1
        try:
            yield from self._relay(request, context, known)
        finally:
            with self._lock:
                self._watching[peer] -= 1
                if self._watching[peer] <= 0:
                    del self._watching[peer]

    def _relay(self, request: Any, context: Any, known: Callable[[str, Any], object]) -> Iterator[list]:
        render_id, after = request.render_id, request.after_event_id or "0"
        with self._joining:  # a crowd arriving at once reads Redis a few at a time
            known(render_id, context)
            sub = self.hub.subscribe(render_id, after)
        context.add_callback(lambda: sub.push(END))  # a client that leaves frees its thread at once
        try:
            with self._joining:
                first = list(sub.fresh(backlog(self.store, render_id, after)))
            if first:
                yield [self.hub.encode(render_id, event_id, event) for event_id, event in first]
            while context.is_active():
                delivery: list = []
                for batch in sub.take(WATCH_IDLE_S):
                    if batch is END:
                        if delivery:
                            yield delivery
                        return
                    delivery += [wire for _event_id, wire in sub.fresh(batch)]  # encoded once by the hub
                if delivery:
                    yield delivery
                outage = self.hub.outage_since
                if outage is not None and time.monotonic() - outage > WATCH_OUTAGE_S:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "the farm's Redis is unreachable; watch again")
        finally:
            self.hub.unsubscribe(sub)
