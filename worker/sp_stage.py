"""Stage 1 as a task runs it: plain, split k ways in this process (`--local`'s plan), this
rank of a gang's group, or resumed from the states a gang kept after a finished step."""

from __future__ import annotations

import numpy as np

from ltx_engine.rules.generation import stage1_sampler

RESUME = "resume"  # input names: resume.video.latent, resume.audio.positions, ...
STATE_FIELDS = ("latent", "denoise_mask", "clean_latent", "positions")


def state_arrays(video, audio) -> dict[str, np.ndarray]:
    """The states after a step, as named arrays (kept as blobs; `resume_from` reads them back)."""
    out = {f"{RESUME}.video.{f}": np.ascontiguousarray(getattr(video, f)) for f in STATE_FIELDS}
    if audio is not None:
        out |= {f"{RESUME}.audio.{f}": np.ascontiguousarray(getattr(audio, f)) for f in STATE_FIELDS}
    return out


def resume_from(params: dict, inputs: dict[str, np.ndarray]):
    """The `Resume` a task's `resume_step` and resume.* inputs describe, else None."""
    step = params.get("resume_step")
    if step is None:
        return None
    from ltx_engine.parallel.sp_denoise import Resume
    from ltx_engine.rules.sampling import LatentState

    def state(name: str):
        keys = [f"{RESUME}.{name}.{f}" for f in STATE_FIELDS]
        return LatentState(*(inputs[k] for k in keys)) if keys[0] in inputs else None

    return Resume(int(step), state("video"), state("audio"))


def split_of(params: dict, group=None):
    """The split a task's forwards run: a gang's rank of `group`, else `stage1_parallel` shards in this
    process (`farm render --local`'s plan; 1 = unsplit)."""
    from ltx_engine.parallel.sp_denoise import Split

    return Split(group.size(), group) if group is not None else Split(int(params.get("stage1_parallel") or 1))


def run_stage1(
    runner, pack, params: dict, inputs: dict[str, np.ndarray], step, group=None, on_step=None
) -> dict:
    """Stage 1 with the sampler the planner recorded (else the one the pack calls for); k shards
    (`stage1_parallel`, or the gang's group size) and a resume take the sequence-parallel loop, which is
    bit-identical to the plain one (ltx_engine/parallel/sequence_parallel.py)."""
    if not params.get("sampler"):
        params = {**params, "sampler": stage1_sampler(pack.generation, bool(params.get("dfr_slots")))}
    stage = runner._stage(pack, params, inputs)
    split, resume = split_of(params, group), resume_from(params, inputs)
    if split.degree == 1 and resume is None and on_step is None:
        return runner.engine.denoise_stage1(pack, stage, step)
    return runner.engine.denoise_stage1_sp(pack, stage, split, step, resume, on_step)
