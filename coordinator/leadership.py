"""Leadership: which of the coordinators on one Redis serves the farm.

Each coordinator runs a Leadership thread that claims the lease in Redis (coordinator/state/lua/
leadership.lua, Redis TIME as the clock) every `lease_ms / 8`. The holder serves: its scheduler,
reducer and gRPC services run, and every script it runs is fenced with its epoch (common.lua), so
once another coordinator takes the lease not one write of the old leader lands. The others stand by:
their gRPC services answer UNAVAILABLE with the leader's address (LeaderGate), and they take over
when the lease lapses, resuming what a restarted coordinator resumes (Scheduler.start).

A leader that cannot renew (Redis away) stops answering at once and stops calling itself leader
before its lease can lapse in Redis; if it renews again and nobody took over, it carries on with the
same epoch, otherwise it stops its loops and stands by.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Protocol

import grpc

from coordinator.api.auth import abort_handler
from coordinator.state.store import EpochNotReplicated, NotLeader, is_transient
from protos.endpoints import standby_details
from protos.retry import Outage

log = logging.getLogger(__name__)

LEASE_MS = 5_000
_GATED_PREFIX = "/ltxfarm.v1."


class EpochReads(Protocol):
    """What the epoch check reads: the lease as stored, and the epoch this coordinator writes under."""

    epoch: str

    def leader(self) -> dict: ...


def check_epoch(store: EpochReads) -> None:
    """Raise NotLeader unless the lease in Redis still carries our epoch: what a writer of files (reducer
    outputs, an assembly) calls just before it publishes one, since the Lua fence (common.lua) guards
    only Redis. An unfenced store (epoch '': tests, tools) passes."""
    epoch = getattr(store, "epoch", "")
    if epoch and str(store.leader().get("epoch") or "") != epoch:
        raise NotLeader(f"not the leader (epoch {epoch} is over)")


class LostEpoch:
    """A loop's one line when its writes are refused because another coordinator leads now (a paused
    old leader woke up): logged once per loss instead of a traceback per pass; the loop goes on until
    Leadership stands it down, or its epoch is current again."""

    def __init__(self, what: str, logger: logging.Logger) -> None:
        self.what, self.log = what, logger
        self.noted = False

    def note(self, exc: BaseException) -> None:
        if not self.noted:
            self.noted = True
            self.log.warning("%s: this coordinator lost its epoch (%s); another one leads, standing by", self.what,
                             str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    def ok(self) -> None:
        self.noted = False


class PassLoop(threading.Thread):
    """A leader's loop of passes (`one_pass`) until stop(), skipped while `leading()` is false: a lost
    epoch is one line (LostEpoch), a Redis or blob outage one line when it starts and one when it ends
    (Outage), any other error a traceback; each costs only its pass, the next one tries again."""

    def __init__(self, name: str, what: str, logger: logging.Logger, interval_s: float,
                 leading: Callable[[], bool] = lambda: True) -> None:
        super().__init__(name=name, daemon=True)
        self.what, self.log, self.interval_s, self.leading = what, logger, interval_s, leading
        self._halt = threading.Event()

    def one_pass(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        deposed, outage = LostEpoch(self.what, self.log), Outage(self.what, self.log)
        while not self._halt.wait(self.interval_s):
            if not self.leading():
                continue
            try:
                self.one_pass()
                deposed.ok()
            except NotLeader as exc:
                deposed.note(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                if not is_transient(exc) and not outage.down:
                    self.log.exception("%s: a pass failed", self.what)
                outage.failed(exc)
                continue
            outage.ok()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(10)


class LeaseStore(Protocol):
    """What Leadership needs of the store: the lease claim, and the epoch every fenced script carries."""

    epoch: str

    def claim_leadership(self, node: str, address: str, lease_ms: int) -> tuple[bool, int, str]: ...


class Leadership(threading.Thread):
    """Claims the lease in a loop and calls on_lead / on_standby when the role changes."""

    def __init__(self, store: LeaseStore, address: str, on_lead: Callable[[], None], on_standby: Callable[[], None],
                 lease_ms: int = LEASE_MS) -> None:
        super().__init__(name="farm-leadership", daemon=True)
        self.store, self.address, self.lease_ms = store, address, lease_ms
        self.on_lead, self.on_standby = on_lead, on_standby
        self.node = secrets.token_hex(8)
        self.leading = False  # loops running under our epoch
        self.serving = threading.Event()  # answer farm RPCs (set only while our lease surely holds)
        self.leader_address = ""
        self.epoch = 0
        self._valid_until = 0.0
        self._halted = threading.Event()
        self._redis_down = False
        self._epoch_waits = False  # the claim failed for want of a replica's acknowledgement
        store.epoch = "0"  # no epoch is 0: until we lead, every fenced write of ours is refused

    def claim_once(self) -> None:
        """One claim/renew and what follows from its answer (also called once before start())."""
        sent = time.monotonic()
        try:
            lead, epoch, leader = self.store.claim_leadership(self.node, self.address, self.lease_ms)
        except Exception as exc:  # noqa: BLE001 - Redis away: we cannot renew, the deadline below decides
            waiting = isinstance(exc, EpochNotReplicated)
            if not self._redis_down or waiting != self._epoch_waits:  # one line per reason, not per claim
                if waiting:
                    log.warning("leadership: the new epoch waits for a replica's acknowledgement (none in "
                                "time); not leading until a replica holds it, retrying")
                else:
                    log.warning("leadership: cannot reach Redis (%s); retrying", type(exc).__name__)
            self._redis_down, self._epoch_waits = True, waiting
            self._check_deadline()
            return
        if self._redis_down:
            log.info("leadership: Redis is back")
        self._redis_down = False
        self.leader_address = leader
        if lead:
            self._valid_until = sent + self.lease_ms / 1000 * 0.8  # lapse locally before Redis does
            self._lead(epoch)
        elif self.leading:
            log.warning("leadership: %s took over (epoch %d); standing by", leader or "another coordinator", epoch)
            self._stand_by()

    def _lead(self, epoch: int) -> None:
        if self.leading and epoch != self.epoch:
            self._stand_by()  # lapsed and retaken by someone between our claims: restart clean
        if not self.leading:
            self.epoch = epoch
            self.store.epoch = str(epoch)
            log.info("leadership: leading the farm on %s (epoch %d)", self.address, epoch)
            self.on_lead()
            self.leading = True
        self.serving.set()

    def is_serving(self) -> bool:
        """Leading and surely still within our lease (a renewal stuck in a hung Redis call counts too)."""
        return self.serving.is_set() and time.monotonic() < self._valid_until

    def _check_deadline(self) -> None:
        if self.serving.is_set() and time.monotonic() > self._valid_until:
            log.warning("leadership: lease not renewed in time; not serving until it is")
            self.serving.clear()

    def _stand_by(self) -> None:
        self.serving.clear()
        if self.leading:
            self.leading = False
            self.on_standby()

    def run(self) -> None:
        while not self._halted.wait(self.lease_ms / 8000):
            try:
                self.claim_once()
            except Exception:  # noqa: BLE001 - starting or stopping the loops failed: claim again next tick
                log.exception("leadership: changing role failed; trying again")

    def halt(self) -> None:
        """Stop claiming and answering (the lease is still ours until release() or it lapses)."""
        self._halted.set()
        if self.is_alive():
            self.join(5)
        self.serving.clear()

    def release(self) -> None:
        """Hand the lease back at once, so a standby need not wait for it to lapse."""
        self.halt()
        try:
            self.store.claim_leadership(self.node, self.address, 0)
        except Exception:  # noqa: BLE001 - the lease then lapses by itself
            log.warning("leadership: could not resign; the lease lapses in %d ms", self.lease_ms)


class LeaderGate(grpc.ServerInterceptor):
    """Farm RPCs reach the servicers only on the serving leader; elsewhere they fail UNAVAILABLE with
    the leader's address, which workers and clients follow (protos.endpoints)."""

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or not method.startswith(_GATED_PREFIX) or self.leadership.is_serving():
            return handler
        leader = self.leadership.leader_address
        if leader == self.leadership.address:
            leader = ""  # our own lease, not renewed in time: nobody to send them to yet
        return abort_handler(handler, grpc.StatusCode.UNAVAILABLE, standby_details(leader))
