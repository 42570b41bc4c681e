"""Logging for every farm entry point (`farm coordinator`, `farm up`, `farm worker`): stderr plus a
rotating file in the data folder's logs/, so what a loop logged during an outage is still there when
someone looks the next morning (`farm doctor` names the files)."""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_BYTES = 10 * 2**20
BACKUPS = 3


def log_path(data_dir: Path, name: str) -> Path:
    """data_dir/logs/NAME.log: coordinator.log (farm coordinator, farm up), worker.log (farm worker)."""
    return Path(data_dir).expanduser() / "logs" / f"{name}.log"


def setup_logging(log_file: Path | None = None, level: int = logging.INFO) -> Path | None:
    """INFO and up to stderr and, when given, to log_file (rotated at 10 MiB, 3 kept). Safe to call twice:
    handlers already in place are not added again."""
    root = logging.getLogger()
    root.setLevel(level)
    formatter = logging.Formatter(FORMAT)
    if not any(type(h) is logging.StreamHandler for h in root.handlers):
        stream = logging.StreamHandler()
        stream.setFormatter(formatter)
        root.addHandler(stream)
    if log_file is None:
        return None
    log_file = Path(log_file).expanduser().resolve()
    if any(getattr(h, "baseFilename", None) == str(log_file) for h in root.handlers):
        return log_file
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.handlers.RotatingFileHandler(log_file, maxBytes=MAX_BYTES, backupCount=BACKUPS)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    return log_file
