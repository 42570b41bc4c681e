"""Building blocks of stage graphs: task records and references between task outputs. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from ltx_engine.components import task_needs
from protos.fields import SpecError  # noqa: F401 - the contract's refusal; planners raise it from here

CAPABILITY = "mlx"
COORDINATOR = "coordinator"  # tasks the coordinator's reducer runs (pure math between tiled forwards)
SPATIAL_FACTOR = 32
TEMPORAL_FACTOR = 8


def latent_frames(frames: int) -> int:
    return (frames - 1) // TEMPORAL_FACTOR + 1


def latent_grid(spec: Mapping) -> tuple[int, int, int]:
    """The full-resolution latent grid (frames, height, width) the decode sees: of the shipped clip,
    which DFR temporal rounds lengthen (validation resolves it as "output_frames")."""
    frames = spec.get("output_frames") or spec["frames"]
    return latent_frames(frames), spec["height"] // SPATIAL_FACTOR, spec["width"] // SPATIAL_FACTOR


def audio_latent_frames(frames: int, fps: float, latents_per_second: float = 25.0) -> int:
    """Audio latent length for the clip's duration (16 kHz / hop 160 / downsample 4 = 25 per second)."""
    return round(frames / fps * latents_per_second)


def ref(task: str, output: str) -> dict:
    """An input that is another task's output."""
    return {"task": task, "output": output}


def task(
    render_id: str, name: str, kind: str, params: dict, inputs: dict, capability: str = CAPABILITY
) -> dict:
    """A task record; its deps are the tasks its inputs come from. A worker task that loads models
    names in `params["needs"]` the components of `params["pack"]` it loads: the lease script hands it
    only to a worker whose pack holds them."""
    deps = sorted({r["task"] for r in inputs.values() if "task" in r})
    if capability == CAPABILITY and "pack" in params:
        params = {**params, "needs": task_needs(kind, params)}
    return {
        "id": f"{render_id}.{name}",
        "kind": kind,
        "params": params,
        "inputs": inputs,
        "deps": deps,
        "capability": capability,
    }


def expect(dtype: str, *shape: int) -> dict:
    """An output's dtype and shape (-1: any size on that axis); no shape: dtype only."""
    return {"dtype": dtype, "shape": list(shape)} if shape else {"dtype": dtype}
