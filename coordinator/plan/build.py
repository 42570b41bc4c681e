"""The recipes' builds: a recipe's graph after the prompt's text task, composed of the shared blocks. Pure.

Why: a recipe (plan/recipes/) names its build, and a build composes the blocks its recipe needs (the stage
blocks of plan/stages.py, which apply the modifiers that cross recipes as they make each task; the guided
stage; the clip, chunk and HDR graphs; the decode). `plan_render` only makes the prompt's text task, asks
the render's recipe for the rest and costs the graph: no dispatch on features, no pass over a finished list.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.plan import samplers, sp_degree, sparse
from coordinator.plan.audio_only import plan_audio_only
from coordinator.plan.chunks import chunked, lead_chain, plan_chunks
from coordinator.plan.clip import plan_clip
from coordinator.plan.control import Reference, reference
from coordinator.plan.decode import Keyframes, plan_decode
from coordinator.plan.decode_keyframes import keyframe_decode_io
from coordinator.plan.dfr import (
    canvas_frames,
    detailing_params,
    dfr_on,
    output_frames,
    plan_slot_upsample,
    slot_count,
    slot_expect,
    slot_params,
)
from coordinator.plan.dfr_finish import plan_dfr_finish, stage_view
from coordinator.plan.diffusion_decode import is_diffusion
from coordinator.plan.graph import SPATIAL_FACTOR, StageGeometry, expect, ref, task
from coordinator.plan.guidance import check_recipe
from coordinator.plan.guided_render import contexts_of, negative_text_task
from coordinator.plan.hdr import plan_hdr
from coordinator.plan.images import carried_slots, generated_slot_params, plan_image_encodes
from coordinator.plan.loras import lora_params
from coordinator.plan.media import a2v_negative, frozen_track, plan_video_encode
from coordinator.plan.resolved import RenderPlan
from coordinator.plan.stage2 import stage2_sigmas
from coordinator.plan.stages import (
    Guided,
    RecipeStages,
    stage1_block,
    stage2_block,
    stage_audio,
    upsample_block,
)
from ltx_engine.rules.generation import stage1_sampler
from ltx_engine.rules.sampling import DISTILLED_SIGMAS


@dataclass(frozen=True, slots=True)
class Prompt:
    """The render's prompt as a build reads it: the render id, the prompt-enhancement tasks, the text task
    (relayed, keyed on the LoRAs) and its contexts, the plain ones (a chunked window relays its own), and
    the text cache key of a spec (the negative prompt's)."""

    rid: str
    enhancer: tuple[dict, ...]
    text: dict
    ctx: dict
    plain: tuple[dict, dict]
    key: Callable[[RenderPlan], str]

    @property
    def tasks(self) -> list[dict]:
        """The enhancement and the text task, what most graphs start with."""
        return [*self.enhancer, self.text]


def build_t2a(recipe: RecipeStages, spec: RenderPlan, prompt: Prompt) -> list[dict]:
    """T2A: the audio track alone, guided by the recipe's rule (plan/audio_only.py)."""
    rule = check_recipe(spec, recipe.guidance)
    return [*prompt.tasks, *plan_audio_only(prompt.rid, spec, prompt.text, prompt.ctx, prompt.key, rule)]


def build_hdr(recipe: RecipeStages, spec: RenderPlan, prompt: Prompt) -> list[dict]:
    """The HDR IC-LoRA grade: its own graph from the text task (plan/hdr.py), its decode keyframe-aware
    under the diffusion decoder (the seam slots)."""
    return plan_hdr(prompt.rid, spec, prompt.text, _keyframes(prompt.rid, spec))


def _keyframes(rid: str, spec: RenderPlan, last: str = "stage2") -> Keyframes | None:
    """A keyframe-aware decode's per-task planes (plan/decode_keyframes.py), the generated slots read off
    the `last` stage; None for the conv decoder, which reads none."""
    return functools.partial(keyframe_decode_io, rid, spec, last=last) if is_diffusion(spec) else None


def build_clip(recipe: RecipeStages, spec: RenderPlan, prompt: Prompt) -> list[dict]:
    """Retake / extend: the graphs that start from the user's clip (plan/clip.py); a dev recipe's with its
    negative prompt's text task and guided stage."""
    rule, guided, tasks = check_recipe(spec, recipe.guidance), None, prompt.tasks
    if rule is not None:
        tasks.append(negative_text_task(prompt.rid, spec, rule, prompt.text, prompt.key))
        guided = Guided(rule, prompt.ctx, contexts_of(f"{prompt.rid}.negative"))
    return [*tasks, *plan_clip(prompt.rid, spec, prompt.ctx, guided)]


def build_video(recipe: RecipeStages, spec: RenderPlan, prompt: Prompt) -> list[dict]:
    """The video recipes: a chunked clip's windows (plan/chunks.py); else the image and source encodes, a
    guided recipe's negative prompt, stage 1 (a one-stage recipe's at full size) or the two stages, then
    DFR's finish and the decodes. A2V's track, a control / Dub-It clip and the user LoRAs go to the stage
    blocks, which apply them as they make the tasks."""
    if chunked(spec):  # a guided recipe's windows read one negative text task; the window chain leads
        rule = check_recipe(spec, recipe.guidance)
        negative = None if rule is None else negative_text_task(prompt.rid, spec, rule, prompt.plain[0], prompt.key)
        windows = plan_chunks(prompt.rid, spec, *prompt.plain, recipe, negative)  # plan/chunks.py
        return lead_chain(prompt.rid, spec, [*prompt.enhancer, *windows])
    rid, ctx = prompt.rid, prompt.ctx
    encodes, cond1, cond2, image_params = plan_image_encodes(rid, spec, recipe.two_stage)  # plan/images.py
    tasks = [*prompt.tasks, *encodes, *plan_video_encode(rid, spec)[0]]  # a source clip's tiled encode
    track = frozen_track(rid, spec)  # A2V's frozen source track (plan/media.py)
    rule, guided = check_recipe(spec, recipe.guidance), None
    if rule is not None:  # the dev DiT's guided stage 1 (plan/guided_render.py)
        tasks.append(negative_text_task(rid, spec, rule, prompt.text, prompt.key))
        guided = Guided(rule, ctx, a2v_negative(spec, contexts_of(f"{rid}.negative"), ctx))  # plan/media.py
    if recipe.two_stage:
        tasks += _stages(recipe, rid, stage_view(spec), ctx, (cond1, cond2, image_params), guided, track,
                         reference(rid, spec))  # the control / Dub-It clip (plan/control.py)
        return tasks + _decodes(rid, spec, ref(f"{rid}.stage2", "video_latent"), ctx, cond2, image_params, track)
    geo = StageGeometry(spec.pack, spec.seed, spec.frames, spec.frame_rate, spec.height, spec.width)
    generated = generated_slot_params(spec, spec.height, spec.width)  # full size: the decode reads them as they are
    tasks += stage1_block(rid, geo, ctx, cond2, image_params, *generated, lora_params(spec), guided, track)
    return tasks + _decodes(rid, spec, ref(f"{rid}.stage1", "video_latent"), ctx, cond2, image_params, track,
                            "stage1")


def _stage1_sampler(spec: RenderPlan) -> dict:
    """Stage 1's sampler from the recorded generation; nothing when it is not known (the worker reads
    its pack's)."""
    generation = spec.generation
    return {"sampler": stage1_sampler(generation, dfr_on(spec))} if generation else {}


def _stages(recipe: RecipeStages, rid: str, spec: RenderPlan, ctx: dict, conds: tuple[dict, dict, dict],
            guided: Guided | None, track: dict | None, clip: Reference | None) -> list[dict]:
    """Stage 1, the spatial upsample and stage 2 (on DFR's padded canvas, with its keyframe slots) from the
    stage blocks; `conds`: each stage's image inputs and the images' params; `guided`: a dev recipe's
    guided stage 1 and its stage 2's DiT; `track`: A2V's encode, its latent the stages' frozen audio; `clip`:
    a control / Dub-It reference."""
    cond1, cond2, image_params = conds
    geo = StageGeometry(spec.pack, spec.seed, canvas_frames(spec), spec.frame_rate, spec.height, spec.width)
    half, slots, loras = geo.half(), slot_params(spec), lora_params(spec)
    h2, w2 = half.height, half.width
    generated, generated_expect = generated_slot_params(spec, h2, w2)  # --num-generated-keyframes (plan/images.py)
    carried = carried_slots(spec)  # the ones stage 2 carries for the decode that reads them
    tokens = half.grid[0] * (h2 // SPATIAL_FACTOR) * (w2 // SPATIAL_FACTOR)
    stage1 = {**slots, **generated, **_stage1_sampler(spec), **sparse.stage1_params(spec),
              **sp_degree.stage1_params(spec, tokens, len(DISTILLED_SIGMAS) - 1)}  # its gang cap
    s1 = f"{rid}.stage1"
    tasks = stage1_block(rid, half, ctx, cond1, image_params, stage1, {**slot_expect(spec, h2, w2), **generated_expect},
                         loras, guided, track, clip)
    tasks.append(upsample_block(rid, geo))
    tasks += plan_slot_upsample(rid, spec, ref(s1, "slots"), slot_count(spec) or len(carried))
    carry, carry_expect = generated_slot_params(spec, spec.height, spec.width, carried)
    stage2_params = {"sigmas": stage2_sigmas(spec), "noise_stream": 1, **image_params, **slots, **carry,
                     **sparse.stage2_params(spec), **samplers.stage2_params(spec, recipe.distilled_stage2)}
    stage2_inputs = {**cond2, "latent": ref(f"{rid}.upsample", "latent"), "audio_latent": stage_audio(rid, track)}
    if carried:  # upstream's DFR rule: stage 1's slots, upsampled, the slots' initial latent
        stage2_inputs["slots"] = ref(f"{rid}.upsample.slots", "latent")
    if slots:  # upstream's DFR stage 2: slots from stage 1's, upsampled; audio re-noised and denoised along
        # tiled: frozen, as TDP's audio; A2V: the source track frozen, as in stage 1
        stage2_params["renoise_audio"] = spec.stage2_tiles is None and not spec.audio_input
        stage2_inputs["slots"] = ref(f"{rid}.upsample.slots", "latent")
        stage2_params |= detailing_params(spec)
        if spec.detailing_lora:  # the IC-LoRA's reference: stage 1's half-resolution video
            stage2_inputs["reference_latent"] = ref(s1, "video_latent")
    return tasks + stage2_block(rid, geo, spec, stage2_params, stage2_inputs, ctx,
                                {**slot_expect(spec, spec.height, spec.width), **carry_expect}, loras,
                                guided and guided.stage, clip)


def _decodes(rid: str, spec: RenderPlan, final: dict, ctx: dict, cond2: dict, image_params: dict,
             track: dict | None, last: str = "stage2") -> list[dict]:
    """DFR's finish (rounds, base path or epilogue; the trimmed latent, decoded at the shipped length), the
    video decode (the diffusion decoder's with its keyframes: DFR's planes, else the images'), and the audio
    decode (A2V: its encode is the `audio` task the output muxes)."""
    tasks, decode_spec = [], spec
    if dfr_on(spec):  # plan/dfr_finish.py
        tasks, final = plan_dfr_finish(rid, spec, ctx, cond2, image_params, stage_audio(rid, track))
        decode_spec = spec.resolve(frames=output_frames(spec))
    tasks += plan_decode(rid, decode_spec, final, _keyframes(rid, spec, last))  # each task its planes, if any
    if spec.audio and track is None:
        tasks.append(task(rid, "audio", "decode_audio", {
            "pack": spec.pack, "product": "audio", "expect": {"waveform": expect("float32", -1, -1),
                                                              "sample_rate": expect("int32", 1)}},
            {"latent": ref(f"{rid}.stage1", "audio_latent")}))
    return tasks
