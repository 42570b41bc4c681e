"""A guided stage as tasks: per model evaluation, K pass forwards (workers, at once) and one guide
step (the coordinator's), the way tiled stage 2 is planned. Pure.

`recipe(spec, rule)` resolves a guided recipe's knobs against its rule (`GuidedRule`: upstream's
defaults from ltx-pipelines `constants.py`, LTX-2.3 dev and the HQ recipe, carried on the recipe record); `check_recipe` refuses what cannot run (STG blocks
outside the model, a negative prompt no pass reads, STG without blocks); `plan_guided_stage` lays out
the tasks: the passes the scales make non-trivial (`guidance.passes_needed`), each a
`guidance_pass` task reading the state from the previous step's task, and a `guide_step` task
(capability coordinator) that combines them and steps: Euler per step (one-stage, two-stage stage
1), or for res_2s two rounds per step (`mid` then `end`) and a `final` round when the schedule ends
at 0. The uncond pass reads the negative prompt's contexts, every other pass the prompt's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from coordinator.plan.graph import COORDINATOR, SPATIAL_FACTOR, SpecError, expect, latent_frames, ref, task
from coordinator.plan.images import slot_range
from coordinator.plan.resolved import RenderPlan
from coordinator.plan.sp_degree import pass_params, pass_request
from coordinator.plan.sparse import cache_inputs, step_cache
from ltx_engine.rules import guidance as G
from ltx_engine.rules import res2s
from ltx_engine.rules import step_cache as cache_rule
from ltx_engine.rules.generation import LTX_25
from ltx_engine.rules.schedule import ltx2_sigmas

REFERENCE_LAYERS = 48  # the released LTX-2 / 2.3 DiTs
# The distilled LoRA on the dev DiT (ltx-pipelines `args.py`): HQ's --distilled-lora-strength-stage-1/2
# defaults, and two-stage's --distilled-lora at its default strength (DEFAULT_LORA_STRENGTH).
HQ_STAGE1_LORA, HQ_STAGE2_LORA, TWO_STAGE_LORA = 0.25, 0.5, 1.0
EULER, RES_2S = "euler", "res_2s"
STATE = ("latent", "clean", "mask", "positions")
AUDIO_STATE = tuple(f"audio_{k}" for k in STATE)


@dataclass(frozen=True)
class GuidedStage:
    """A guided recipe's stage-1 (or one-stage) guidance and sampling, resolved from its `GuidedRule` and
    the spec (named apart from `recipes.base.Recipe`, the recipe record that carries the rule)."""

    pipeline: str
    sampler: str
    sigmas: tuple[float, ...]
    video: G.GuiderParams
    audio: G.GuiderParams
    negative_prompt: str
    distilled_lora: float | None = None  # the distilled LoRA's strength on the passes' dev DiT (HQ: 0.25)
    stage2_lora: float | None = None     # ... on stage 2's (two-stage 1.0, HQ 0.5; one-stage has none)
    stream_offset: int = 0               # res_2s SDE noise: stage 2 draws streams of its own
    step_cache: float | None = None      # --step-cache: each pass a chain over the stage's rounds of passes
    bins: tuple[tuple[float, G.GuiderParams, G.GuiderParams], ...] = ()  # --guidance-schedule: (bound, video, audio)
    marker: bool = False                 # LTX-2.5: every pass's video carries the keyframe marker
    stage1_parallel: str | None = None   # --stage1-parallel K: each pass with video gang-leased, K ways at most

    @property
    def passes(self) -> tuple[str, ...]:
        return G.passes_needed(self.video, self.audio)

    def at(self, sigma: float) -> GuidedStage:
        """The guidance of a round at `sigma`: upstream's `MultiModalGuiderFactory.build_from_sigma` per
        modality (`guidance.params_for_sigma`) with a schedule, else the stage's own."""
        if not self.bins:
            return self
        return replace(self, video=G.params_for_sigma(tuple((b, v) for b, v, _ in self.bins), sigma),
                       audio=G.params_for_sigma(tuple((b, a) for b, _, a in self.bins), sigma), bins=())

    def variants(self) -> list[GuidedStage]:
        """Every guidance a round can take (each bin's; the stage's own without a schedule)."""
        return [self.at(bound) for bound, _, _ in self.bins] or [self]

    def forwards_per_step(self) -> int:
        """Passes per step (res_2s: two evaluations, each all the passes)."""
        return len(self.passes) * (2 if self.sampler == RES_2S else 1)


def _override(base: G.GuiderParams, spec: RenderPlan, prefix: str) -> G.GuiderParams:
    def get(name: str, default):
        value = getattr(spec, f"{prefix}{name}")
        return default if value is None else value

    blocks = spec.stg_blocks
    eta = spec.apg_eta
    return G.GuiderParams(cfg_scale=float(get("cfg_scale", base.cfg_scale)),
                          stg_scale=float(get("stg_scale", base.stg_scale)),
                          stg_blocks=tuple(base.stg_blocks if blocks is None else blocks),
                          rescale=float(get("rescale", base.rescale)),
                          modality_scale=float(get("modality_scale", base.modality_scale)),
                          skip_step=int(get("skip_step", base.skip_step)),
                          apg_eta=None if eta is None else float(eta),
                          apg_norm_threshold=float(spec.apg_norm_threshold or 0.0),
                          modality_blocks=None if spec.modality_blocks is None else tuple(spec.modality_blocks))


@dataclass(frozen=True, slots=True)
class GuidedRule:
    """How a guided recipe samples and guides its first stage: data on its recipe record
    (`recipes/base.py`), so no rule here asks which pipeline a render runs."""

    video: G.GuiderParams = G.VIDEO_DEV
    audio: G.GuiderParams = G.AUDIO_DEV
    steps: int = G.DEV_STEPS_2_3
    sampler: str = EULER
    anchored: bool = False               # the scheduler reads the stage-1 latent's tokens (HQ), not the 4096 anchor
    stage1_lora: float | None = None     # the distilled LoRA on the passes' dev DiT (HQ: 0.25)
    stage2_lora: float | None = None     # ... on stage 2's (two-stage 1.0, HQ 0.5; one-stage has no stage 2)
    audio_only: bool = False             # no video stream (T2A): modality guidance off, video params inert


DEV = GuidedRule(stage2_lora=TWO_STAGE_LORA)
DEV_ONE_STAGE = GuidedRule()
HQ = GuidedRule(G.VIDEO_HQ, G.AUDIO_HQ, G.HQ_STEPS, RES_2S, True, HQ_STAGE1_LORA, HQ_STAGE2_LORA)
AUDIO_ONLY = GuidedRule(audio_only=True)


def recipe(spec: RenderPlan, rule: GuidedRule | None) -> GuidedStage | None:
    """The render's guided stage resolved from its recipe's rule and the spec's knobs; None when the
    recipe runs no guidance (the distilled ones)."""
    if rule is None:
        return None
    if rule.audio_only:
        return _audio_only(spec, rule)
    video = _override(rule.video, spec, "")
    audio = _override(rule.audio, spec, "audio_")
    if spec.audio_input:  # A2V (plan/media.py): a frozen track, upstream's audio guider off
        audio = G.GuiderParams(skip_step=video.skip_step)  # a frozen track's x0 is never read: skip with video
    bins = tuple(_bin(video, audio, bound, dict(pairs), bool(spec.audio_input))
                 for bound, pairs in spec.guidance_schedule or ())
    steps = stage1_steps(spec) or rule.steps
    negative = spec.negative_prompt
    sigmas = ltx2_sigmas(int(steps), **({"tokens": _stage1_tokens(spec)} if rule.anchored and spec.frames else {}))
    return GuidedStage(pipeline=spec.pipeline, sampler=rule.sampler, sigmas=sigmas, video=video,
                  audio=audio, negative_prompt=G.DEFAULT_NEGATIVE_PROMPT if negative is None else str(negative),
                  distilled_lora=rule.stage1_lora, stage2_lora=rule.stage2_lora,
                  step_cache=step_cache(spec), bins=bins, marker=spec.generation == LTX_25,
                  stage1_parallel=pass_request(spec))


def _bin(video: G.GuiderParams, audio: G.GuiderParams, bound: float, given: dict, a2v: bool) -> tuple:
    """One --guidance-schedule bin: its overrides on the render's resolved guidance (A2V's frozen track
    keeps its guider off, skipping with the video)."""
    v = replace(video, **{k: given[k] for k in given if not k.startswith("audio_")})
    a = replace(audio, **{k.removeprefix("audio_"): given[k] for k in given if k.startswith("audio_")})
    return float(bound), v, (G.GuiderParams(skip_step=v.skip_step) if a2v else a)


def _audio_only(spec: RenderPlan, rule: GuidedRule) -> GuidedStage:
    """T2A (upstream's t2a_one_stage): the audio guider of the dev recipe with modality guidance off (no
    video to isolate from); the video's params are inert and carry the audio's skip step, which rounds follow."""
    audio = replace(_override(rule.audio, spec, "audio_"), modality_scale=1.0)
    negative = spec.negative_prompt
    return GuidedStage(pipeline=spec.pipeline, sampler=rule.sampler,
                  sigmas=ltx2_sigmas(int(stage1_steps(spec) or rule.steps)),
                  video=G.GuiderParams(skip_step=audio.skip_step), audio=audio,
                  negative_prompt=G.DEFAULT_NEGATIVE_PROMPT if negative is None else str(negative))


def stage1_steps(spec: RenderPlan) -> int | None:
    """--stage1-steps, or --steps (the MLX port's name for one-stage and stage 1 alike); both must agree."""
    steps, stage1 = spec.steps, spec.stage1_steps
    if steps is not None and stage1 is not None and int(steps) != int(stage1):
        raise SpecError(f"--steps {steps} and --stage1-steps {stage1} disagree: give one")
    return stage1 if stage1 is not None else steps


def _stage1_tokens(spec: RenderPlan) -> int:
    """The HQ pipeline hands the scheduler its stage-1 latent (the others pass none: the 4096 anchor)."""
    return latent_frames(spec.frames) * (spec.height // 2 // SPATIAL_FACTOR) * (
        spec.width // 2 // SPATIAL_FACTOR)


def check_recipe(spec: RenderPlan, rule: GuidedRule | None, num_layers: int = REFERENCE_LAYERS) -> GuidedStage | None:
    """The guided stage, or one line saying why it cannot run on a DiT of `num_layers` blocks."""
    rec = recipe(spec, rule)
    if rec is None:
        return None
    for p in (p for r in rec.variants() for p in (r.video, r.audio)):
        outside = sorted(b for b in p.stg_blocks if b >= num_layers)
        if outside and p.needs_perturbed():
            given = "--stg-blocks" if spec.stg_blocks is not None else "the default --stg-blocks (the 22B's)"
            raise SpecError(f"{given} {','.join(map(str, outside))}: outside the model's {num_layers} "
                            f"blocks (0..{num_layers - 1}); give --stg-blocks with blocks in that range")
        if p.needs_perturbed() and not p.stg_blocks:
            raise SpecError("an STG scale needs --stg-blocks (the blocks whose self-attention the pass skips)")
    _check_modality_blocks(spec, rec, num_layers)
    if spec.negative_prompt is not None and not _any_pass(rec, G.UNCOND):
        raise SpecError("--negative-prompt needs a cfg scale other than 1 (only the uncond pass reads it)")
    _check_skip_and_apg(spec, rec)
    return rec


def _any_pass(rec: GuidedStage, name: str) -> bool:
    """Whether some round of the stage runs pass `name`."""
    return any(name in r.passes for r in rec.variants())


def _check_modality_blocks(spec: RenderPlan, rec: GuidedStage, num_layers: int) -> None:
    """--modality-blocks: some block, each inside the model, and a modality pass that reads them."""
    blocks = spec.modality_blocks
    if blocks is None:
        return
    if not blocks:
        raise SpecError("--modality-blocks needs at least one block (leave it out for every block)")
    outside = sorted(b for b in blocks if b >= num_layers)
    if outside:
        raise SpecError(f"--modality-blocks {','.join(map(str, outside))}: outside the model's {num_layers} "
                        f"blocks (0..{num_layers - 1}); give --modality-blocks with blocks in that range")
    if not _any_pass(rec, G.ISOLATED):
        raise SpecError("--modality-blocks needs a modality scale other than 1 (only the modality pass reads it)")


def _check_skip_and_apg(spec: RenderPlan, rec: GuidedStage) -> None:
    """The skip step and APG knobs that would change nothing, or that the farm cannot run as asked."""
    if rec.bins and rec.step_cache is not None:
        raise SpecError("--guidance-schedule and --step-cache: the schedule changes a round's passes, which the "
                        "step cache replays as one chain per pass; give one")
    if rec.video.skip_step != rec.audio.skip_step and rec.step_cache is not None:
        raise SpecError(f"--skip-step {rec.video.skip_step} and --audio-skip-step {rec.audio.skip_step} differ: "
                        "--step-cache replays whole passes, so it needs both the same")
    if spec.apg_eta is not None and not _any_pass(rec, G.UNCOND):
        raise SpecError("--apg-eta needs a cfg scale other than 1 (APG reshapes the CFG term)")
    if spec.apg_norm_threshold is not None and spec.apg_eta is None:
        raise SpecError("--apg-norm-threshold needs --apg-eta (it clips APG's delta)")


@dataclass(frozen=True)
class Evaluation:
    """One round of passes: its name in task ids, the sigma the passes run at, the guide step's kind."""

    label: str
    step: int
    sigma: float
    evaluation: str


def evaluations(rec: GuidedStage) -> list[Evaluation]:
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


def held_streams(rec: GuidedStage, ev: Evaluation, prefixes: tuple[str, ...]) -> tuple[str, ...]:
    """The streams (prefixes) whose guider skips the round and reuse their last guided x0: upstream's
    `should_skip_step` per modality on the denoiser's step index (res_2s's substep calls it with index 0:
    never skipped). All of them: the round runs no passes; one: the passes run with it frozen."""
    index = 0 if ev.evaluation == "end" else ev.step
    params = {"": rec.video, "audio_": rec.audio}
    return tuple(p for p in prefixes if G.skips_step(params[p], index))


STREAM_NAMES = {"": "video", "audio_": "audio"}  # a pass's `frozen`: the stream the engine runs disabled


def _cache(rid: str, stage: str, rec: GuidedStage, name: str, chain: tuple[int, int, str | None]) -> tuple[dict, dict]:
    """A pass's step cache: (params, inputs) at its place (k of n rounds with passes, the last such round's
    label) in its chain over the stage; nothing without --step-cache."""
    k, n, previous = chain
    if rec.step_cache is None:
        return {}, {}
    params = {cache_rule.PARAM: float(rec.step_cache), cache_rule.STEP_PARAM: k, cache_rule.STEPS_PARAM: n}
    return params, ({} if previous is None else cache_inputs(f"{rid}.{stage}.{previous}.{name}"))


def _pass_task(rid: str, stage: str, ev: Evaluation, name: str, rec: GuidedStage, params: dict, state: dict,
               ctx: dict, prefixes: tuple[str, ...], chain: tuple[int, int, str | None] = (0, 0, None),
               frozen: str | None = None, loras: dict | None = None) -> dict:
    """One pass; `frozen`: the stream whose guider skips this round (its x0 neither computed nor sent);
    `loras`: the render's LoRA set its DiT carries."""
    contexts = ctx["negative"] if name == G.UNCOND else ctx["prompt"]
    video, audio = "" in prefixes, "audio_" in prefixes
    cache_params, cache_in = _cache(rid, stage, rec, name, chain)
    out = {f"{p}x0": expect("float32", 1, -1, -1) for p in prefixes if p != frozen}
    grid = stage_grid(params) if video and "frames" in params else (0, 0, 0)
    return task(rid, f"{stage}.{ev.label}.{name}", "guidance_pass",
                {"pack": params["pack"], "pass": name, "sigma": ev.sigma, "step": ev.step,
                 "cells": grid[0] * grid[1] * grid[2], **(marker_params(params, grid) if rec.marker and video else {}),
                 **(pass_params(rec.stage1_parallel, grid[0] * grid[1] * grid[2]) if video and frozen != "" else {}),
                 "video": G.params_to_dict(rec.video) if video else None,
                 "audio": G.params_to_dict(rec.audio) if audio else None,
                 **({} if frozen is None else {"frozen": STREAM_NAMES[frozen]}),
                 **({} if rec.distilled_lora is None else {"distilled_lora_strength": rec.distilled_lora}),
                 **cache_params, **(loras or {}), "expect": out},
                {**state, **contexts, **cache_in})


def stage_grid(params: dict) -> tuple[int, int, int]:
    """The latent grid of a stage's generated video from its geometry params."""
    return (latent_frames(int(params["frames"])), params["height"] // SPATIAL_FACTOR, params["width"] // SPATIAL_FACTOR)


def marker_params(params: dict, grid: tuple[int, int, int]) -> dict:
    """A pass's LTX-2.5 keyframe marker, as upstream's guided passes read it off the state: the first
    latent frame and the stage's generated keyframe slots (their token range), nothing else."""
    slots = slot_range(params, grid)
    return {"marker": True, "grid": list(grid), **({} if slots is None else {"slot_range": slots})}


def _round_passes(rec: GuidedStage, prefixes: tuple[str, ...], held: tuple[str, ...]) -> tuple[str, ...]:
    """The passes a round runs: none when every stream is held, the running stream's alone when one is
    (upstream runs the held guider's passes too, with that stream frozen: the running stream's combine
    reads none of them), else every pass either guider needs."""
    if held == prefixes:
        return ()
    if held:
        running = [p for p in prefixes if p not in held][0]
        return G.passes_needed(rec.audio if running else rec.video)
    return rec.passes


@dataclass(frozen=True)
class Round:
    """One round as planned: its evaluation, its guidance (its sigma's bin), the streams it holds, its passes."""

    ev: Evaluation
    guide: GuidedStage
    held: tuple[str, ...]
    passes: tuple[str, ...]


def rounds_of(rec: GuidedStage, prefixes: tuple[str, ...]) -> list[Round]:
    """Every round of the stage with the streams `prefixes` ("" video, "audio_")."""
    out = []
    for ev in evaluations(rec):
        guide = rec.at(ev.sigma)  # --guidance-schedule: each round its sigma's bin
        held = held_streams(guide, ev, prefixes)  # never the first round
        out.append(Round(ev, guide, held, _round_passes(guide, prefixes, held)))
    return out


def _flag(streams: tuple[str, ...], prefixes: tuple[str, ...]) -> bool | list[str]:
    """A guide step's held / keep_x0 value: True for every stream (as plans wrote it before one stream
    could be held alone), else the streams' prefixes."""
    return True if streams == prefixes else list(streams)


def plan_guided_stage(rid: str, stage: str, rec: GuidedStage, params: dict, source: str, ctx: dict,
                      audio: bool = True, finish: dict | None = None, video: bool = True,
                      loras: dict | None = None) -> list[dict]:
    """The stage's pass and guide-step tasks. `source`: the task whose outputs are the initial state
    (STATE with video, AUDIO_STATE with audio; T2A's stage has no video); `ctx`: {"prompt": {name: ref},
    "negative": {name: ref}} (video_context, audio_context, context_mask refs). The last guide step is
    named `stage`; with `finish` ({grid, audio_channels}) it also outputs `video_latent` / `audio_latent`
    unpatchified; `loras`: the render's LoRA set, which every pass's DiT carries."""
    prefixes = (("",) if video else ()) + (("audio_",) if audio else ())
    names = (STATE if video else ()) + (AUDIO_STATE if audio else ())
    fixed = {k: ref(source, k) for k in names if not k.endswith("latent")}
    latents = {k: ref(source, k) for k in names if k.endswith("latent")}
    tasks: list[dict] = []
    planned = rounds_of(rec, prefixes)
    rounds, held = [r.ev for r in planned], [r.held for r in planned]
    mid_src = None
    chained = [r.ev.label for r in planned if r.passes]  # the rounds a pass's step cache runs over
    for i, ev in enumerate(rounds):
        guide, passes = planned[i].guide, planned[i].passes
        k = chained.index(ev.label) if passes else 0
        chain = (k, len(chained), chained[k - 1] if k else None)
        frozen = held[i][0] if passes and held[i] else None
        tasks += [_pass_task(rid, stage, ev, name, guide, params, {**fixed, **latents}, ctx, prefixes, chain, frozen,
                             loras)
                  for name in passes]
        step_in = {f"{name}_{p}x0": ref(f"{rid}.{stage}.{ev.label}.{name}", f"{p}x0")
                   for name in passes for p in prefixes if p not in held[i]}
        step_in |= {f"held_{p}x0": ref(mid_src, f"{p}x0") for p in held[i]}
        step_in |= fixed | latents  # an `end` step reads the midpoint's latent: only its shape and masks count
        if ev.evaluation == "end":
            step_in |= {f"{p}{k}": ref(mid_src, f"{p}{k}") for p in prefixes for k in ("x_mid", "anchor", "eps1")}
        last = i == len(rounds) - 1
        name = stage if last else f"{stage}.{ev.label}"
        keep = () if last else held[i + 1]
        tasks.append(task(rid, name, "guide_step",
                          {**({"finish": finish} if last and finish else {}), "evaluation": ev.evaluation, "step": ev.step, "sigmas": list(_schedule(rec)),
                           "passes": list(passes), "seed": int(params.get("seed", 0)),
                           **({"held": _flag(held[i], prefixes)} if held[i] else {}),
                           **({"keep_x0": _flag(keep, prefixes)} if keep else {}),
                           **({"stream_offset": rec.stream_offset} if rec.stream_offset else {}),
                           "video": G.params_to_dict(guide.video) if video else None,
                           "audio": G.params_to_dict(guide.audio) if audio else None, "expect": {}},
                          step_in, capability=COORDINATOR))
        mid_src = f"{rid}.{name}"
        latents = {k: ref(mid_src, k) for k in latents}  # the next round reads this step's latent (or midpoint)
    return tasks


def _schedule(rec: GuidedStage) -> tuple[float, ...]:
    return res2s.res2s_sigmas(rec.sigmas) if rec.sampler == RES_2S else rec.sigmas
