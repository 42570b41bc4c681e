"""A guided stage as tasks: per model evaluation, K pass forwards (workers, at once) and one guide
step (the coordinator's), the way tiled stage 2 is planned. Pure.

`recipe(spec)` resolves a dev pipeline's knobs against upstream's defaults (ltx-pipelines
`constants.py`: LTX-2.3 dev, and the HQ recipe); `check_recipe` refuses what cannot run (STG blocks
outside the model, a negative prompt no pass reads, STG without blocks); `plan_guided_stage` lays out
the tasks: the passes the scales make non-trivial (`guidance.passes_needed`), each a
`guidance_pass` task reading the state from the previous step's task, and a `guide_step` task
(capability coordinator) that combines them and steps: Euler per step (one-stage, two-stage stage
1), or for res_2s two rounds per step (`mid` then `end`) and a `final` round when the schedule ends
at 0. The uncond pass reads the negative prompt's contexts, every other pass the prompt's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from coordinator.plan.graph import COORDINATOR, SPATIAL_FACTOR, SpecError, expect, latent_frames, ref, task
from ltx_engine import guidance as G
from ltx_engine import res2s
from ltx_engine.schedule import ltx2_sigmas
from protos.guidance_spec import DISTILLED, ONE_STAGE, TWO_STAGE_HQ

REFERENCE_LAYERS = 48  # the released LTX-2 / 2.3 DiTs
# The distilled LoRA on the dev DiT (ltx-pipelines `args.py`): HQ's --distilled-lora-strength-stage-1/2
# defaults, and two-stage's --distilled-lora at its default strength (DEFAULT_LORA_STRENGTH).
HQ_STAGE1_LORA, HQ_STAGE2_LORA, TWO_STAGE_LORA = 0.25, 0.5, 1.0
EULER, RES_2S = "euler", "res_2s"
STATE = ("latent", "clean", "mask", "positions")
AUDIO_STATE = tuple(f"audio_{k}" for k in STATE)


@dataclass(frozen=True)
class Recipe:
    """A dev pipeline's stage-1 (or one-stage) guidance and sampling, resolved."""

    pipeline: str
    sampler: str
    sigmas: tuple[float, ...]
    video: G.GuiderParams
    audio: G.GuiderParams
    negative_prompt: str
    distilled_lora: float | None = None  # the distilled LoRA's strength on the passes' dev DiT (HQ: 0.25)
    stage2_lora: float | None = None     # ... on stage 2's (two-stage 1.0, HQ 0.5; one-stage has none)
    stream_offset: int = 0               # res_2s SDE noise: stage 2 draws streams of its own

    @property
    def passes(self) -> tuple[str, ...]:
        return G.passes_needed(self.video, self.audio)

    def forwards_per_step(self) -> int:
        """Passes per step (res_2s: two evaluations, each all the passes)."""
        return len(self.passes) * (2 if self.sampler == RES_2S else 1)


def _override(base: G.GuiderParams, spec: Mapping, prefix: str) -> G.GuiderParams:
    def get(name: str, default):
        value = spec.get(f"{prefix}{name}")
        return default if value is None else value

    blocks = spec.get("stg_blocks")
    return G.GuiderParams(cfg_scale=float(get("cfg_scale", base.cfg_scale)),
                          stg_scale=float(get("stg_scale", base.stg_scale)),
                          stg_blocks=tuple(base.stg_blocks if blocks is None else blocks),
                          rescale=float(get("rescale", base.rescale)),
                          modality_scale=float(get("modality_scale", base.modality_scale)))


def recipe(spec: Mapping) -> Recipe | None:
    """The resolved recipe of a guided pipeline; None for the distilled one."""
    name = spec.get("pipeline") or DISTILLED
    if name == DISTILLED:
        return None
    hq = name == TWO_STAGE_HQ
    video = _override(G.VIDEO_HQ if hq else G.VIDEO_DEV, spec, "")
    audio = _override(G.AUDIO_HQ if hq else G.AUDIO_DEV, spec, "audio_")
    if spec.get("audio_input"):  # A2V (plan/media.py): a frozen track, upstream's audio guider off
        audio = G.GuiderParams()
    steps = stage1_steps(spec) or (G.HQ_STEPS if hq else G.DEV_STEPS_2_3)
    negative = spec.get("negative_prompt")
    sigmas = ltx2_sigmas(int(steps), **({"tokens": _stage1_tokens(spec)} if hq and spec.get("frames") else {}))
    stage2 = None if name == ONE_STAGE else HQ_STAGE2_LORA if hq else TWO_STAGE_LORA
    return Recipe(pipeline=name, sampler=RES_2S if hq else EULER, sigmas=sigmas, video=video,
                  audio=audio, negative_prompt=G.DEFAULT_NEGATIVE_PROMPT if negative is None else str(negative),
                  distilled_lora=HQ_STAGE1_LORA if hq else None, stage2_lora=stage2)


def stage1_steps(spec: Mapping) -> int | None:
    """--stage1-steps, or --steps (the MLX port's name for one-stage and stage 1 alike); both must agree."""
    steps, stage1 = spec.get("steps"), spec.get("stage1_steps")
    if steps is not None and stage1 is not None and int(steps) != int(stage1):
        raise SpecError(f"--steps {steps} and --stage1-steps {stage1} disagree: give one")
    return stage1 if stage1 is not None else steps


def _stage1_tokens(spec: Mapping) -> int:
    """The HQ pipeline hands the scheduler its stage-1 latent (the others pass none: the 4096 anchor)."""
    return latent_frames(int(spec["frames"])) * (spec["height"] // 2 // SPATIAL_FACTOR) * (
        spec["width"] // 2 // SPATIAL_FACTOR)


def check_recipe(spec: Mapping, num_layers: int = REFERENCE_LAYERS) -> Recipe | None:
    """The recipe, or one line saying why it cannot run on a DiT of `num_layers` blocks."""
    rec = recipe(spec)
    if rec is None:
        return None
    for p in (rec.video, rec.audio):
        outside = sorted(b for b in p.stg_blocks if b >= num_layers)
        if outside and p.needs_perturbed():
            raise SpecError(f"--stg-blocks {','.join(map(str, outside))}: outside the model's {num_layers} "
                            f"blocks (0..{num_layers - 1})")
        if p.needs_perturbed() and not p.stg_blocks:
            raise SpecError("an STG scale needs --stg-blocks (the blocks whose self-attention the pass skips)")
    if spec.get("negative_prompt") is not None and G.UNCOND not in rec.passes:
        raise SpecError("--negative-prompt needs a cfg scale other than 1 (only the uncond pass reads it)")
    return rec


@dataclass(frozen=True)
class Evaluation:
    """One round of passes: its name in task ids, the sigma the passes run at, the guide step's kind."""

    label: str
    step: int
    sigma: float
    evaluation: str


def evaluations(rec: Recipe) -> list[Evaluation]:
    """Every round of passes of the stage, in order."""
    s = rec.sigmas
    if rec.sampler == EULER:
        return [Evaluation(f"s{i}", i, float(s[i]), "euler") for i in range(len(s) - 1)]
    ext = res2s.res2s_sigmas(s)
    out = []
    for i in range(res2s.full_steps(s)):
        sub = float(res2s.F64(res2s.F32(ext[i])) * res2s.F64(res2s.F32(ext[i + 1]))) ** 0.5
        out += [Evaluation(f"s{i}a", i, float(ext[i]), "mid"), Evaluation(f"s{i}b", i, sub, "end")]
    if float(s[-1]) == 0:
        n = res2s.full_steps(s)
        out.append(Evaluation(f"s{n}", n, float(ext[n]), "final"))
    return out


def _pass_task(rid: str, stage: str, ev: Evaluation, name: str, rec: Recipe, params: dict, state: dict,
               ctx: dict, audio: bool) -> dict:
    contexts = ctx["negative"] if name == G.UNCOND else ctx["prompt"]
    out = {"x0": expect("float32", 1, -1, -1)} | ({"audio_x0": expect("float32", 1, -1, -1)} if audio else {})
    cells = latent_frames(int(params["frames"])) * (params["height"] // SPATIAL_FACTOR) * (
        params["width"] // SPATIAL_FACTOR) if "frames" in params else 0
    return task(rid, f"{stage}.{ev.label}.{name}", "guidance_pass",
                {"pack": params["pack"], "pass": name, "sigma": ev.sigma, "step": ev.step, "cells": cells,
                 "video": G.params_to_dict(rec.video), "audio": G.params_to_dict(rec.audio) if audio else None,
                 **({} if rec.distilled_lora is None else {"distilled_lora_strength": rec.distilled_lora}),
                 "expect": out},
                {**state, **contexts})


def plan_guided_stage(rid: str, stage: str, rec: Recipe, params: dict, source: str, ctx: dict,
                      audio: bool = True, finish: dict | None = None) -> list[dict]:
    """The stage's pass and guide-step tasks. `source`: the task whose outputs are the initial state
    (STATE, and AUDIO_STATE with audio); `ctx`: {"prompt": {name: ref}, "negative": {name: ref}}
    (video_context, audio_context, context_mask refs). The last guide step is named `stage`; with
    `finish` ({grid, audio_channels}) it also outputs `video_latent` / `audio_latent` unpatchified."""
    names = STATE + (AUDIO_STATE if audio else ())
    fixed = {k: ref(source, k) for k in names if not k.endswith("latent")}
    latents = {k: ref(source, k) for k in names if k.endswith("latent")}
    tasks: list[dict] = []
    rounds = evaluations(rec)
    prefixes = ("", "audio_") if audio else ("",)
    mid_src = None
    for i, ev in enumerate(rounds):
        tasks += [_pass_task(rid, stage, ev, name, rec, params, {**fixed, **latents}, ctx, audio)
                  for name in rec.passes]
        step_in = {f"{name}_{p}x0": ref(f"{rid}.{stage}.{ev.label}.{name}", f"{p}x0")
                   for name in rec.passes for p in prefixes}
        step_in |= fixed | latents  # an `end` step reads the midpoint's latent: only its shape and masks count
        if ev.evaluation == "end":
            step_in |= {f"{p}{k}": ref(mid_src, f"{p}{k}") for p in prefixes for k in ("x_mid", "anchor", "eps1")}
        last = i == len(rounds) - 1
        name = stage if last else f"{stage}.{ev.label}"
        tasks.append(task(rid, name, "guide_step",
                          {**({"finish": finish} if last and finish else {}), "evaluation": ev.evaluation, "step": ev.step, "sigmas": list(_schedule(rec)),
                           "passes": list(rec.passes), "seed": int(params.get("seed", 0)),
                           **({"stream_offset": rec.stream_offset} if rec.stream_offset else {}),
                           "video": G.params_to_dict(rec.video), "audio": G.params_to_dict(rec.audio) if audio else None,
                           "expect": {}},
                          step_in, capability=COORDINATOR))
        mid_src = f"{rid}.{name}"
        latents = {k: ref(mid_src, k) for k in latents}  # the next round reads this step's latent (or midpoint)
    return tasks


def _schedule(rec: Recipe) -> tuple[float, ...]:
    return res2s.res2s_sigmas(rec.sigmas) if rec.sampler == RES_2S else rec.sigmas
