"""Part 4: a worker's helper threads (prefetch, heartbeat, presence) run below the forward's
priority, and the forward's own thread keeps its priority."""

from __future__ import annotations

import sys
import threading

import grpc
import pytest

from worker import quiet
from worker.prefetch import Prefetcher

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are a Linux reading")


class _Refused(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


@pytest.mark.timeout(10)
def test_the_prefetch_thread_runs_niced_and_the_caller_does_not():
    seen: list[int] = []
    asked = threading.Event()

    def ask(_request):
        seen.append(quiet.priority())
        asked.set()
        raise _Refused()

    before = quiet.priority()
    Prefetcher(ask, lambda sha: b"", lambda sha: False).start(object())
    assert asked.wait(5)
    # every ask the thread made ran niced (a refused ask is retried, so there may be more than one by now)
    assert seen and all(p == min(before + quiet.NICE, 19) for p in list(seen))  # relative; capped at 19
    assert quiet.priority() == before


@pytest.mark.timeout(10)
def test_background_lowers_only_the_calling_thread():
    seen: list[tuple[bool, int]] = []
    thread = threading.Thread(target=lambda: seen.append((quiet.background(), quiet.priority())))
    thread.start()
    thread.join(5)
    assert seen and seen[0][0] and seen[0][1] > quiet.priority()


def test_freezing_the_startup_heap_empties_the_collected_generations():
    import gc

    try:
        assert quiet.freeze_startup_heap() > 0
        assert sum(gc.get_count()) < 100
    finally:
        gc.unfreeze()
