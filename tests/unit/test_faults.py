"""The worker's class of a task error (worker/faults.py): what the coordinator's failure policy reads."""

from __future__ import annotations

import subprocess

import pytest

from ltx_engine.rules.errors import PermanentTaskError
from protos.states import Fault
from worker.faults import classify
from worker.gang import GangBroke
from worker.loras import LoraFileError

pytestmark = pytest.mark.timeout(30)


def _raised_from(cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as exc:
            raise RuntimeError("the forward failed") from exc
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize(("exc", "fault"), [
    (PermanentTaskError("LoRA x: its data is cut short"), Fault.PERMANENT),
    (MemoryError(), Fault.TRANSIENT),
    (RuntimeError("[metal::malloc] Attempting to allocate 9 GB: out of memory"), Fault.TRANSIENT),
    (OSError(28, "No space left on device"), Fault.TRANSIENT),
    (subprocess.TimeoutExpired(["rank"], 5), Fault.TRANSIENT),
    (GangBroke("rank exited -9"), Fault.TRANSIENT),
    (LoraFileError("LoRA x: fetch of blob 1234 failed"), Fault.TRANSIENT),
    (_raised_from(ConnectionResetError()), Fault.TRANSIENT),
    (ValueError("Expected shape (4, 8) but received shape (8, 4)"), Fault.UNKNOWN),  # this Mac's copy, or not
    (RuntimeError("the forward failed"), Fault.UNKNOWN),
])
def test_classify(exc: BaseException, fault: Fault) -> None:
    assert classify(exc) == fault
