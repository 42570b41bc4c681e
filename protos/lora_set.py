"""The name a render's LoRA set goes by between the coordinator and the workers.

A worker that keeps a DiT with a LoRA set (fused, or with its adapters attached) warm reports this name
among its warm models, and every DiT task of a render with that set asks for it (`params["warm"]`), so
the lease script's warm-model affinity prefers the worker that already holds it. The name is a digest of
what the spec records (mode, each LoRA's blob sha256 or pack file name, its strength written exactly), in
the set's order: another order sums the updates in another order, so it is another model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

PREFIX = "loras:"


def warm_key(loras: Sequence[Mapping], mode: str) -> str:
    """`loras:` + 16 hex digits naming the (mode, LoRAs, strengths) set."""
    parts = [str(mode)]
    for lora in loras:
        source = f"blob:{lora['blob']}" if lora.get("blob") else f"file:{lora['file']}"
        parts.append(f"{source}@{float(lora['strength']).hex()}")
    return PREFIX + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def missing_file(file: str, pack: str) -> str:
    """The one line for `--lora NAME.safetensors` that is neither a path on the submitting machine (the
    client sends a bare name only when it found no such file) nor a file in the pack folder: naming both
    places, since naming only the pack read as if the path had never been looked for."""
    return (f"--lora {file}: no such file on this machine, nor in the folder of pack {pack!r}: give the "
            ".safetensors file's path, or put the file in the pack folder")
