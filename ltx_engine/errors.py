"""The engine's refusal that needs no model library: pure modules (LoRA key and shape checks the
coordinator runs at submit) raise it as the loader does."""

from __future__ import annotations


class PackError(ValueError):
    """A pack that cannot be loaded: the message names the file and the key."""
