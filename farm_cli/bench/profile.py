"""Where a bench's time goes inside this process: a stack sampler (py-spy is not at hand everywhere).

A daemon thread reads every thread's Python stack (sys._current_frames) about once a millisecond and
counts, per function, the samples it was on the stack at all (inclusive) and on top (self), and per
package the samples on top (grpc, redis, coordinator, ...). Time spent in C (gRPC core, hashing) lands
on the Python function that called it. Threads parked in a known wait (idle pool threads, a Condition,
a Redis reply being waited for, a socket accept) are left out; a thread that waits for the GIL is
counted where it stands, so the shares are of threads wanting the CPU, not of CPU seconds.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from types import FrameType


def _label(frame: FrameType) -> str:
    code = frame.f_code
    path = code.co_filename.rsplit("/", 2)
    return f"{'/'.join(path[-2:])}:{code.co_name}"


WAITING = ("threading.py:wait", "threading.py:_wait_for_tstate_lock", "_server.py:_serve",
           "thread.py:_worker", "selectors.py:select", "bench_profile.py:_run",
           "hiredis.py:read_from_socket", "socket.py:accept", "bench_transitions.py:_child_round")


def _package(frame: FrameType) -> str:
    """The installed package (grpc, redis, google for protobuf), our top-level folder or the stdlib module."""
    path = frame.f_code.co_filename
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0]
    parts = path.rsplit("/", 2)
    return parts[-2] if len(parts) > 2 and parts[-2] in OURS else parts[-1].removesuffix(".py")


OURS = ("coordinator", "protos", "farm_cli", "worker")


class StackSampler:
    """`with StackSampler() as s: ...; s.report(15)`: the top functions by samples in this process."""

    def __init__(self, interval_s: float = 0.001) -> None:
        self.interval_s = interval_s
        self.inclusive: Counter[str] = Counter()
        self.own: Counter[str] = Counter()
        self.packages: Counter[str] = Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.is_set():
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    self._count(frame)
            time.sleep(self.interval_s)

    def _count(self, frame: FrameType | None) -> None:
        top = _label(frame) if frame else ""
        if not frame or top.endswith(WAITING):
            return  # a thread parked in a wait: no work to attribute
        self.samples += 1
        self.own[top] += 1
        self.packages[_package(frame)] += 1
        seen = set()
        while frame is not None:
            label = _label(frame)
            if label not in seen:
                seen.add(label)
                self.inclusive[label] += 1
            frame = frame.f_back

    def report(self, top: int = 15) -> list[str]:
        """Lines: share of busy samples per function, inclusive then self."""
        n = max(1, self.samples)
        lines = [f"busy samples: {self.samples}; on top, by package: " + ", ".join(
            f"{name} {100 * c / n:.0f}%" for name, c in self.packages.most_common(6))]
        for title, counts in (("inclusive", self.inclusive), ("self", self.own)):
            lines.append(f"-- {title}")
            lines += [f"{100 * c / n:5.1f}%  {label}" for label, c in counts.most_common(top)]
        return lines
