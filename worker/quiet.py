"""Keep a worker's forward alone on its cores: its helper threads yield to it.

A forward shares the agent's process with the heartbeat, the presence stream, the next task's prefetch
and pack copies. Each is small, but on a Mac with few performance cores (or this 2-core VM) a helper
woken mid-forward takes a core from the thread building or evaluating the graph, and the forward on
the farm costs more than the same forward in-process. Each helper thread marks itself background at its
start: nice +10 on Linux (per thread: Linux schedules threads as tasks), the utility QoS class on macOS
(the scheduler keeps it off the performance cores while they are busy). Their work is latency-tolerant
(a heartbeat every lease/3, a prefetch that only has to beat the next lease), and a helper never waits on
the forward, so lowering them cannot stall it. Best effort: where the call is missing, nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import sys
import threading

log = logging.getLogger("farm.worker")

NICE = 10
QOS_CLASS_UTILITY = 0x11  # <sys/qos.h>


def _darwin_background() -> bool:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libSystem.dylib")
    return libc.pthread_set_qos_class_self_np(QOS_CLASS_UTILITY, 0) == 0


def background() -> bool:
    """Lower the calling thread's scheduling priority by NICE below the thread that starts it; True when it
    took. Relative, so a worker started under `nice` keeps its helpers below its forward (an absolute
    value would raise them above a forward niced past it)."""
    try:
        if sys.platform == "darwin":
            return _darwin_background()
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, priority() + NICE))
        return True
    except (OSError, AttributeError) as exc:  # a sandbox without the call: the helper runs as before
        log.debug("helper thread priority unchanged: %s", exc)
        return False


def priority() -> int:
    """The calling thread's nice value on Linux (what a test reads); 0 elsewhere."""
    if sys.platform == "darwin":
        return 0
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def freeze_startup_heap() -> int:
    """Move what the agent built at start (modules, gRPC and protobuf tables: ~60k objects, ~15-30 ms a full
    collection here) out of the collector's generations: a collection that fires while a forward builds its
    graph then scans only the task's own objects. Safe: those objects live as long as the process."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
