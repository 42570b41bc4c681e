"""The engine's refusal that needs no model library: pure modules (LoRA key and shape checks the
coordinator runs at submit) raise it as the loader does."""

from __future__ import annotations


class PackError(ValueError):
    """A pack that cannot be loaded: the message names the file and the key."""


class PermanentTaskError(ValueError):
    """The task's own input is wrong, so every worker would raise the same: no retry can help (the
    render fails at once with this line, and no worker is blamed). Raise it only where the cause is
    the render's spec or the files it names, never this machine's copy of something."""

    retryable = False
