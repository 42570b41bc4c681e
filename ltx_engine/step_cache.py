"""Step caching on the DiT: one forward's block stack skipped or run, its state carried between steps.

`StepCache` is the state of one chain of forwards over a stage's steps: a stage run in one process
(distilled stage 1, untiled stage 2) keeps it in memory; a chain of tasks (a guidance pass across its
stage's rounds, a stage-2 tile across its steps) hands it on as arrays (`to_arrays` / `from_arrays`),
an output blob of one step's task and an input of the next, so any worker continues it. The decision
(`ltx_engine.rules.step_cache`) reads only those arrays and the step index, so every worker and
`render --local` decide alike. What is cached: per modality, the block stack's residual (its output
minus its input) of the last computed step; the gate of the last step (computed or not) and the sum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import mlx.core as mx
import numpy as np

from ltx_engine.models.dit_blocks import StreamArgs
from ltx_engine.rules import step_cache as rule

PREFIX = "cache_"
Blocks = Callable[[StreamArgs | None, StreamArgs | None], tuple]


@dataclass
class StepCache:
    """threshold and steps: the rule's; step: the index of the next forward; skipped: forwards skipped."""

    threshold: float
    steps: int
    step: int = 0
    gate: np.ndarray | None = None
    accumulated: float = 0.0
    residuals: tuple[np.ndarray | None, np.ndarray | None] | None = None
    skipped: int = 0
    _undo: tuple | None = field(default=None, repr=False)

    def run(self, model, v: StreamArgs | None, a: StreamArgs | None, blocks: Blocks) -> tuple:
        """The block stack of this step's forward: run (its residual kept) or replayed from the cache.
        A forward run again at the same step (the compute dtype's overflow guard) decides from the
        same state as the first time."""
        if self._undo is not None and self._undo[0] == self.step:
            self.gate, self.accumulated, self.residuals, self.skipped = self._undo[1:]
        self._undo = (self.step, self.gate, self.accumulated, self.residuals, self.skipped)
        gate = np.array(model.first_block_gate(v, a).astype(mx.float32))
        distance = None if self.gate is None else rule.relative_l1(gate, self.gate)
        verdict = rule.decide(self.step, self.steps, distance, self.accumulated, self.threshold)
        self.gate, self.accumulated = gate, verdict.accumulated
        if not verdict.compute and self.residuals is not None:
            self.skipped += 1
            return _add(v, self.residuals[0]), _add(a, self.residuals[1])
        out_v, out_a = blocks(v, a)
        self.residuals = (_residual(v, out_v), _residual(a, out_a))
        return out_v, out_a

    def next_step(self) -> None:
        """The chain moves on: the next forward is the next step's."""
        self.step += 1
        self._undo = None

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The state a chain's next task reads (`cache_*` outputs); nothing once the last step ran."""
        if self.step >= self.steps - 1 or self.gate is None or self.residuals is None:
            return {}
        out = {f"{PREFIX}gate": self.gate, f"{PREFIX}sum": np.array([self.accumulated], np.float64)}
        for name, res in zip(("residual", "audio_residual"), self.residuals, strict=True):
            out[f"{PREFIX}{name}"] = np.zeros((0,), np.float32) if res is None else res  # empty: no such stream
        return out


def from_params(params: dict, inputs: dict[str, np.ndarray], default_steps: int = 0) -> StepCache | None:
    """The cache a task's params ask for (`step_cache` threshold, `cache_step` of `cache_steps`), with
    the previous step's state from its `cache_*` inputs; None when the render caches nothing."""
    if params.get(rule.PARAM) is None:
        return None
    cache = StepCache(rule.check_threshold(params[rule.PARAM]), int(params.get(rule.STEPS_PARAM, default_steps)),
                      int(params.get(rule.STEP_PARAM, 0)))
    if f"{PREFIX}gate" not in inputs:
        return cache
    residuals = tuple(r if r is not None and r.size else None
                      for r in (inputs.get(f"{PREFIX}{n}") for n in ("residual", "audio_residual")))
    return replace(cache, gate=inputs[f"{PREFIX}gate"], accumulated=float(inputs[f"{PREFIX}sum"][0]),
                   residuals=residuals)


def _residual(before: StreamArgs | None, after: StreamArgs | None) -> np.ndarray | None:
    if before is None or after is None:
        return None
    return np.array((after.x - before.x).astype(mx.float32))


def _add(s: StreamArgs | None, residual: np.ndarray | None) -> StreamArgs | None:
    if s is None or residual is None:
        return s
    return replace(s, x=s.x + mx.array(residual).astype(s.x.dtype))
