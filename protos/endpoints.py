"""Coordinator address lists: what workers and clients share to follow the leading coordinator.

`--coordinator a:1,b:2` names every coordinator of a farm; one leads (holds the leadership lease in
Redis), the others stand by and answer every farm RPC with UNAVAILABLE and, in its details, where the
leader is. Callers keep one channel per address and move on: to the named leader when told, else to
the next address in the list.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

STANDBY_PREFIX = "standby coordinator; the leader is at "
NO_LEADER = "standby coordinator; no leader yet"
# How long a client given several coordinators waits for one to lead (a takeover under way) before it
# says the farm is unreachable: the leadership lease (5 s, coordinator/leadership.py) lapsing, the
# standby's next claim (every lease / 8) and its start, with room to spare.
LEADER_WAIT_S = 15.0
# How gRPC, the pinned channel and a standby say that a call reached no leader: nothing acted on it,
# so sending it again (to the leader, once there is one) cannot do anything twice.
_NOT_DELIVERED = ("failed to connect", "connection refused", "unreachable (", "standby coordinator")


def parse_addresses(value: str | Iterable[str]) -> list[str]:
    """'a:1, b:2' (or a list of such strings) as ['a:1', 'b:2'], order kept, duplicates dropped."""
    parts = [value] if isinstance(value, str) else list(value)
    found = [a.strip() for p in parts for a in p.split(",") if a.strip()]
    if not found:
        raise ValueError("no coordinator address given (HOST:PORT[,HOST:PORT...])")
    return list(dict.fromkeys(found))


def standby_details(leader: str) -> str:
    """What a standby says in an UNAVAILABLE status: the leader's address when one holds the lease."""
    return STANDBY_PREFIX + leader if leader else NO_LEADER


def never_delivered(details: str | None) -> bool:
    """True when an UNAVAILABLE status says the call reached no serving coordinator (connection refused,
    no route, a standby's refusal), as opposed to a call cut off on its way, which may have landed."""
    text = (details or "").lower()
    return any(sign in text for sign in _NOT_DELIVERED)


def leader_hint(details: str | None) -> str | None:
    """The leader's address from a standby's status details, or None."""
    if details and details.startswith(STANDBY_PREFIX):
        return details[len(STANDBY_PREFIX):].strip() or None
    return None


class Endpoints:
    """A rotating pointer into the address list; thread-safe, since a worker's heartbeat and its main
    loop both move it."""

    def __init__(self, addresses: str | Iterable[str]) -> None:
        self.addresses = parse_addresses(addresses)
        self._index = 0
        self._lock = threading.Lock()

    @property
    def current(self) -> str:
        return self.addresses[self._index]

    def __str__(self) -> str:
        return ",".join(self.addresses)

    def use(self, address: str) -> None:
        """Talk to `address` from now on (a probe found the leader there)."""
        with self._lock:
            if address not in self.addresses:
                self.addresses.append(address)
            self._index = self.addresses.index(address)

    def move(self, failed: str, details: str | None = None) -> str:
        """After a call to `failed` came back unavailable: go to the leader it named (added to the
        list if new), else to the address after it. A stale `failed` (another thread already moved
        on) changes nothing."""
        hint = leader_hint(details)
        with self._lock:
            if self.current != failed:
                return self.current
            if hint:
                if hint not in self.addresses:
                    self.addresses.append(hint)
                self._index = self.addresses.index(hint)
            else:
                self._index = (self._index + 1) % len(self.addresses)
            return self.current
