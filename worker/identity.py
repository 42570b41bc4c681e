"""What this worker reports about itself at registration beyond its packs: the project version, MLX
version, backend, chip, installed set and determinism fingerprint (protos/installed.py,
ltx_engine/fingerprint.py). The coordinator refuses another project version, and deals the tiles of
one step (and the ranks of one gang) within one fingerprint class."""

from __future__ import annotations

import mlx.core as mx

from ltx_engine.fingerprint import forward_fingerprint
from protos import installed


def backend() -> str:
    """The device tasks run on, in words: "metal" on a Mac's GPU, else MLX's device type (cpu, gpu)."""
    device = mx.default_device()
    if device.type == mx.gpu and mx.metal.is_available():
        return "metal"
    return "cpu" if device.type == mx.cpu else "gpu"


def identity() -> dict:
    """The registration fields that say which code, libraries and hardware produce this worker's bits."""
    return {"project_version": installed.project_version(), "mlx_version": mx.__version__, "backend": backend(),
            "chip": installed.chip_name(), "installed": installed.installed_set(),
            "fingerprint": forward_fingerprint()}
