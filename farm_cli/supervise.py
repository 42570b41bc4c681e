"""`farm up` keeps its local workers running: a worker process that exits is started again after a
backoff, and the reason is printed. The backoff doubles (1 s up to 30 s) while a worker keeps dying
within a minute of its start, so a broken install does not spin; a worker that ran a while restarts
after 1 s. A worker that exits with code 0 meant to (drained, or stopped on purpose) and stays down.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("farm.up")

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
HEALTHY_AFTER_S = 60.0


def exit_reason(code: int) -> str:
    """'killed by SIGKILL' or 'exit code 3'."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Supervisor(threading.Thread):
    """Starts N worker commands and restarts the ones that die; `procs` always holds the live ones."""

    def __init__(self, commands: list[tuple[str, list[str], Path]], spawn: Callable[[list[str], Path],
                 subprocess.Popen], poll_s: float = 0.2) -> None:
        super().__init__(name="farm-up-supervisor", daemon=True)
        self.commands, self.spawn, self.poll_s = commands, spawn, poll_s
        self.procs: list[subprocess.Popen] = [spawn(cmd, path) for _name, cmd, path in commands]
        self.restarts = [0] * len(commands)
        self._began = [time.monotonic()] * len(commands)
        self._backoff = [FIRST_BACKOFF_S] * len(commands)
        self._due: list[float | None] = [None] * len(commands)  # when a dead worker starts again
        self._done = [False] * len(commands)  # exited cleanly: stays down
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.poll_s):
            for i in range(len(self.commands)):
                self._check(i)

    def _check(self, i: int) -> None:
        name, cmd, worker_log = self.commands[i]
        if self._done[i]:
            return
        if self._due[i] is not None:
            if time.monotonic() >= self._due[i]:
                self._due[i] = None
                self.procs[i] = self.spawn(cmd, worker_log)
                self._began[i] = time.monotonic()
                self.restarts[i] += 1
                log.info("%s started again (pid %d)", name, self.procs[i].pid)
            return
        code = self.procs[i].poll()
        if code is None:
            return
        ran = time.monotonic() - self._began[i]
        if code == 0:
            self._done[i] = True
            log.info("%s exited cleanly after %.0fs (drained or stopped); not restarting", name, ran)
            return
        wait = FIRST_BACKOFF_S if ran >= HEALTHY_AFTER_S else self._backoff[i]
        self._backoff[i] = min(wait * 2, MAX_BACKOFF_S)
        self._due[i] = time.monotonic() + wait
        log.warning("%s (pid %d) %s after %.0fs; restarting in %.0fs (its log: %s)", name, self.procs[i].pid,
                    exit_reason(code), ran, wait, worker_log)

    def halt(self) -> None:
        """Stop restarting (before the workers are stopped on purpose)."""
        self._halt.set()
        if self.is_alive():
            self.join(5)


def stop_processes(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM every process still running, then wait for each; one that outlives grace_s is killed."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
