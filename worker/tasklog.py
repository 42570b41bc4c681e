"""The log lines a task wrote on this worker, kept with its result so `farm logs` and the dashboard's
task popover show them from the coordinator (a Mac's own log file stays where it is)."""

from __future__ import annotations

import logging
import threading

MAX_LINES = 200
MAX_CHARS = 500


class TaskLog(logging.Handler):
    """Collects the records logged by one thread (the task's) from start() until stop()."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.thread = threading.get_ident()
        self.records: list[str] = []
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    @classmethod
    def start(cls) -> TaskLog:
        handler = cls()
        logging.getLogger().addHandler(handler)
        return handler

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread and len(self.records) < MAX_LINES:
            self.records.append(self.format(record)[:MAX_CHARS])

    def lines(self) -> list[str]:
        return list(self.records)

    def stop(self) -> None:
        logging.getLogger().removeHandler(self)
