"""The rules every part of the farm shares, written once: where the coordinator and its dashboard
listen, how long a lease lasts and how often its holder beats, how long an error may be.

Why here: coordinator, worker and CLI meet only through the contract (`protos/`), and each of these
numbers is part of that contract — a worker that beat at another rate than the coordinator expects
would lose its leases.
"""

from __future__ import annotations

import os
from pathlib import Path

COORDINATOR_PORT = 8471
COORDINATOR_HOST = "127.0.0.1"
COORDINATOR_ADDRESS = f"{COORDINATOR_HOST}:{COORDINATOR_PORT}"  # a client's or worker's default
DASHBOARD_PORT = 8470

DATA_ENV = "FARM_DATA"  # the farm's data folder when no --data is given; else ~/.ltx-farm

LEASE_MS = 30_000  # a task lease: what a worker holds without a heartbeat before its task goes back
ERROR_CHARS = 4_000  # a task's error as stored and shown: the tail of a traceback, not the whole log


def heartbeat_ms(lease_ms: int) -> int:
    """A lease holder beats three times per lease, so one or two lost beats never cost the task."""
    return max(1, int(lease_ms) // 3)


def default_data_dir() -> Path:
    """The farm's data folder when none is given: $FARM_DATA, else ~/.ltx-farm (`farm` and the
    coordinator's own entry point agree on it)."""
    return Path(os.environ.get(DATA_ENV) or Path.home() / ".ltx-farm").expanduser()
