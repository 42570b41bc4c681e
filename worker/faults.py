"""A task error's class (protos.states.Fault), as the worker judges it before reporting: whether another
worker could succeed where this one failed.

- permanent: the engine refused the task's own input (`PermanentTaskError`, or any error marked
  `retryable = False`): every worker would hit it, so the render fails at once and nobody is blamed.
- transient: this machine's trouble (out of memory, a killed child process, I/O, a lost gang peer):
  another worker may well succeed, and the same text from two workers proves nothing. Errors of this
  machine's own kinds say so with a class attribute `transient = True` (a broken gang, a LoRA it
  could not fetch).
- unknown: anything else. It is retried elsewhere; the coordinator (common.lua task_fault) takes the
  same text from a second worker as proof that the task itself is at fault.
"""

from __future__ import annotations

import subprocess

from protos.states import Fault

# Messages of the allocators that fail with a RuntimeError rather than a MemoryError (MLX's Metal heap).
OUT_OF_MEMORY = ("out of memory", "insufficient memory", "[metal::malloc]", "cannot allocate memory")
# Exceptions of the machine, not the task: a peer, a pipe, a disk, a child killed or timed out.
TRANSIENT_TYPES: tuple[type[BaseException], ...] = (MemoryError, OSError, EOFError, subprocess.SubprocessError)


def classify(exc: BaseException) -> Fault:
    """The class of `exc` (and of the errors it was raised from) for the coordinator's failure policy."""
    if getattr(exc, "retryable", True) is False:
        return Fault.PERMANENT
    if isinstance(exc, TRANSIENT_TYPES) or getattr(exc, "transient", False) is True:
        return Fault.TRANSIENT
    text = str(exc).lower()
    if any(words in text for words in OUT_OF_MEMORY):
        return Fault.TRANSIENT
    cause = exc.__cause__
    return classify(cause) if cause is not None and cause is not exc else Fault.UNKNOWN
