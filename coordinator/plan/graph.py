"""Building blocks of stage graphs: task records and references between task outputs. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace

from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.components import task_needs
from protos.fields import SpecError  # noqa: F401 - the contract's refusal; planners raise it from here
from protos.kinds import TaskKind, facts

CAPABILITY = "mlx"
COORDINATOR = "coordinator"  # tasks the coordinator's reducer runs (pure math between tiled forwards)
SPATIAL_FACTOR = 32
TEMPORAL_FACTOR = 8


def latent_frames(frames: int) -> int:
    return (frames - 1) // TEMPORAL_FACTOR + 1


def latent_grid(spec: RenderPlan) -> tuple[int, int, int]:
    """The full-resolution latent grid (frames, height, width) the decode sees: of the shipped clip,
    which DFR temporal rounds lengthen (validation resolves it as "output_frames")."""
    frames = spec.output_frames or spec.frames
    return latent_frames(frames), spec.height // SPATIAL_FACTOR, spec.width // SPATIAL_FACTOR


def audio_latent_frames(frames: int, fps: float, latents_per_second: float = 25.0) -> int:
    """Audio latent length for the clip's duration (16 kHz / hop 160 / downsample 4 = 25 per second)."""
    return round(frames / fps * latents_per_second)


def ref(task: str, output: str) -> dict:
    """An input that is another task's output."""
    return {"task": task, "output": output}


def kind_needs(kind: str, params: dict) -> list[str]:
    """The pack components a task of `kind` needs: what it loads (protos/kinds.py) as its params adjust
    it (ltx_engine.rules.components.task_needs), then the files it fuses (the HDR stage's LoRA)."""
    kind_facts = facts(kind)
    return task_needs(kind_facts.components, params) + list(kind_facts.also_needs)


def task(
    render_id: str, name: str, kind: str, params: dict, inputs: dict, capability: str = CAPABILITY
) -> dict:
    """A task record; its deps are the tasks its inputs come from. A worker task that loads models
    names in `params["needs"]` the components of `params["pack"]` it loads: the lease script hands it
    only to a worker whose pack holds them. A kind without facts in protos/kinds.py is refused here."""
    kind = TaskKind(kind).value  # ValueError for a word the contract lacks; the record keeps the plain word
    deps = sorted({r["task"] for r in inputs.values() if "task" in r})
    if capability == CAPABILITY and "pack" in params:
        params = {**params, "needs": kind_needs(kind, params)}
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


@dataclass(frozen=True, slots=True)
class StageGeometry:
    """The clip one stage denoises: what a stage block reads of the render."""

    pack: str
    seed: int
    frames: int  # pixel frames (DFR: its padded canvas)
    fps: float
    height: int
    width: int

    def half(self) -> StageGeometry:
        """Stage 1's: half the size."""
        return replace(self, height=self.height // 2, width=self.width // 2)

    @property
    def grid(self) -> tuple[int, int, int]:
        """The latent (frames, height, width)."""
        return latent_frames(self.frames), self.height // SPATIAL_FACTOR, self.width // SPATIAL_FACTOR

    @property
    def audio_frames(self) -> int:
        return audio_latent_frames(self.frames, self.fps)

    def params(self) -> dict:
        """A stage task's geometry params."""
        return {"pack": self.pack, "seed": self.seed, "frames": self.frames, "fps": self.fps,
                "height": self.height, "width": self.width, "audio_frames": self.audio_frames}


def upstream_of(tasks: list[dict], ids: set[str]) -> set[str]:
    """The tasks `ids` wait on, transitively, with themselves: what must run before the last of them can."""
    deps = {t["id"]: t.get("deps") or [] for t in tasks}
    seen, todo = set(), [i for i in ids if i in deps]
    while todo:
        tid = todo.pop()
        if tid not in seen:
            seen.add(tid)
            todo.extend(deps.get(tid, ()))
    return seen


def mark_lead(tasks: list[dict], heads: set[str]) -> list[dict]:
    """Each task the `heads` wait on (them included) marked `lead`: the scheduler leases it before the
    other tasks of its priority band (common.lua `ready_score`, lease_sim's queue key). Why a closure and
    not a cost path: a step's tiles all feed its join, so they are marked alike and stay side by side in
    the queue, as speed-aware dealing counts them."""
    lead = upstream_of(tasks, heads)
    return [{**t, "lead": True} if t["id"] in lead else t for t in tasks]
