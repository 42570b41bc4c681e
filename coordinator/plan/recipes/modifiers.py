"""The flags that cross recipes, each declared once with the recipes it composes with. Pure.

Why one table: before it, each feature module carried its own prose list of the flags it refused, so
the matrix of what composes with what was scattered over a dozen modules and worded a dozen ways.
Here each modifier names the recipes that take it (one direction only: recipes do not list modifiers);
`refusal` is the one generic check, worded one way. The table holds exactly the combinations the farm
builds; a flag's own rules (ranges, sizes, a pack that lacks something) stay with the flag's module.
"""

from __future__ import annotations

from coordinator.plan.recipes.base import Modifier, Recipe
from coordinator.plan.resolved import RenderPlan
from protos.guidance_spec import KNOBS

DISTILLED, ONE_STAGE, TWO_STAGE, HQ = "distilled", "one-stage", "two-stage", "two-stage-hq"
DFR, RETAKE, EXTEND, IC_LORA, DUB_IT, HDR = "dfr", "retake", "extend", "ic-lora", "dub-it", "hdr-ic-lora"
RETAKE_DEV, EXTEND_DEV = "retake-dev", "extend-dev"
T2A = "t2a"
# the recipes with a picture
VIDEO = (DISTILLED, ONE_STAGE, TWO_STAGE, HQ, DFR, RETAKE, RETAKE_DEV, EXTEND, EXTEND_DEV, IC_LORA, DUB_IT, HDR)
ALL = (*VIDEO, T2A)
GUIDED = (ONE_STAGE, TWO_STAGE, HQ)
GUIDED_CLIP = (RETAKE_DEV, EXTEND_DEV)  # the clip recipes whose stage is guided: the guidance knobs, no Prompt Relay
# The guidance knobs T2A takes as upstream's t2a_one_stage does (its steps, negative prompt and audio guider;
# `--stg-blocks` is the audio's there); the others shape the video's guidance or the joint passes.
AUDIO_KNOBS = ("steps", "negative_prompt", "audio_cfg_scale", "audio_stg_scale", "audio_rescale", "stg_blocks",
               "audio_skip_step")
# The audio's guidance scales apart from the steps they share: a frozen track (A2V) takes none of them.
AUDIO_SCALES = ("audio_cfg_scale", "audio_stg_scale", "audio_rescale")
SHARED_KNOBS = tuple(k for k in AUDIO_KNOBS if k not in AUDIO_SCALES)
VIDEO_KNOBS = tuple(k for k in KNOBS if k not in (*AUDIO_KNOBS, "stage2_steps", "audio_modality_scale"))
AUDIO_GUIDANCE = ("--audio-cfg-scale … (audio guidance)", "--audio-modality-scale")
CHUNK_FIELDS = ("chunked", "chunk_pixel_frames", "chunk_carry_frames", "chunk_blend_frames", "chunk_carry")
TRAINED_WITH = "the IC-LoRA the clip was trained with: --ic-lora FILE STRENGTH"
DFR_STAGES = ("--dfr", "--temporal-upscalings", "--spatial-upscalings 2")  # what makes a render DFR's


def _value(spec: RenderPlan, name: str) -> object:
    return getattr(spec, name)


def _given(value: object) -> bool:
    """A field the user set: not empty, zero, false or `auto` (the fields' "not asked" values)."""
    return bool(value) and value != "auto"


def _unfused(spec: RenderPlan) -> bool:
    return bool(_value(spec, "loras")) and str(_value(spec, "lora_mode") or "fused") != "fused"


def _sp(spec: RenderPlan) -> bool:
    return str(_value(spec, "stage1_parallel") or "auto") not in ("auto", "1")


def _epilogue(spec: RenderPlan) -> bool:
    return int(_value(spec, "spatial_upscalings") or 1) != 1


def _diffusion(spec: RenderPlan) -> bool:
    return _value(spec, "video_decoder") not in (None, "conv")


def _attention(spec: RenderPlan) -> bool:
    return any(clip is not None and clip.attention_strength != 1.0 for clip in (spec.control_video, spec.dub_video))


def _control_stage2(spec: RenderPlan) -> bool:
    return any(clip is not None and clip.stage2 for clip in (spec.control_video, spec.dub_video))


def _except(*names: str) -> tuple[str, ...]:
    """The video recipes but these."""
    return tuple(n for n in VIDEO if n not in names)


MODIFIERS: tuple[Modifier, ...] = (
    # inputs that pick a recipe of their own
    Modifier("--hdr-ic-lora", "an SDR clip graded to HDR", ("hdr_ic_lora",), (HDR,), selects=HDR),
    Modifier("--retake", "regenerate a window of a clip", ("retake",), (RETAKE, RETAKE_DEV), selects=RETAKE,
             picks_rule="a retake is one full-size stage, distilled or guided on dev (--pipeline one-stage): "
                  "upstream's RetakePipeline has no stage 2"),
    Modifier("--extend", "continue a clip", ("extend",), (RETAKE, RETAKE_DEV, EXTEND, EXTEND_DEV), selects=EXTEND,
             picks_rule="an extend pins the clip's boundary in two stages, half then full size: distilled or "
                        "guided on dev (--pipeline two-stage); HQ's res_2s stage 2 is not built on its window"),
    Modifier("--control-video", "an IC-LoRA control clip", ("control_video",), (IC_LORA,), selects=IC_LORA,
             needs=("--ic-lora",), rule=TRAINED_WITH,
             picks_rule="IC-LoRA control samples distilled: upstream's ICLoraPipeline takes the distilled model "
                        "alone, and the MLX port's dev mode fuses the distilled LoRA and runs no guidance"),
    Modifier("--dub", "Dub-It's reference clip", ("dub_video",), (DUB_IT,), selects=DUB_IT, needs=("--ic-lora",),
             rule=TRAINED_WITH,
             picks_rule="Dub-It samples distilled: upstream's DubItPipeline and the MLX port's lipdub take the "
                        "distilled model alone, its LoRA in both stages"),
    Modifier("--dfr", "DFR at 0 temporal rounds (its canvas, slots, keyframes)", ("dfr",), (DFR, IC_LORA, DUB_IT),
             selects=DFR, excludes=("--chunked",), rule="DFR's canvas and epilogue span the whole clip"),
    # modifiers
    Modifier("--ic-lora", "the IC-LoRA of a control or Dub-It clip", ("ic_lora",), (IC_LORA, DUB_IT)),
    Modifier("--control-attention", "the control clip's attention strength (Dub-It's reference takes full attention)",
             ("control_video", "dub_video"), (IC_LORA,), on=_attention),
    Modifier("--control-stage2", "the control clip and its IC-LoRA in stage 2 too, at full size (the MLX port's "
             "control-aware refine; Dub-It's reference is in both stages always)", ("control_video", "dub_video"),
             (IC_LORA,), on=_control_stage2, excludes=DFR_STAGES, rule="DFR's stage 2 takes stage 1's video as its "
             "IC-LoRA reference"),
    Modifier("--control-mask", "a grey clip: per region, the control's attention strength (upstream's "
             "--conditioning-attention-mask)", ("control_mask",), (IC_LORA,)),
    Modifier("a source video", "a clip the render encodes", ("source_video",), _except(IC_LORA, DUB_IT, HDR)),
    Modifier("--image", "images / keyframes conditioning frames", ("images",), _except(RETAKE, RETAKE_DEV, EXTEND, EXTEND_DEV, HDR)),
    Modifier("--audio", "an audio track to generate video for (A2V; the track is frozen)", ("audio_input",),
             (DISTILLED, ONE_STAGE, TWO_STAGE, HQ, DFR), excludes=AUDIO_GUIDANCE,
             rule="the track is frozen: no audio guidance"),
    Modifier("--enhance-prompt", "the prompt rewritten by the text encoder's Gemma 3 before it is encoded",
             ("enhance_prompt",), (*_except(HDR), T2A)),
    Modifier("--lora", "user LoRAs on every DiT task", ("loras",), (*_except(HDR), T2A)),
    Modifier("--step-cache", "TeaCache: a step's block stack replayed from the last computed step's residual",
             ("step_cache",),
             (*_except(DFR, RETAKE, RETAKE_DEV, EXTEND, EXTEND_DEV, HDR), T2A)),
    Modifier("--lora-mode unfused", "user LoRAs as run-time adapters", ("lora_mode",),
             (DISTILLED, *GUIDED, DFR, RETAKE, EXTEND, IC_LORA, DUB_IT), on=_unfused),
    Modifier("--stage2-tiles", "stage 2 split into tiles across Macs", ("stage2_tiles",),
             (DISTILLED, TWO_STAGE, DFR, EXTEND, IC_LORA, DUB_IT)),
    Modifier("--stage2-sigmas", "stage 2's sigma table", ("stage2_sigmas",),
             _except(ONE_STAGE, RETAKE_DEV, HDR)),  # the grade's one stage runs the distilled table
    Modifier("--stage2-steps", "the last N steps of stage 2's table", ("stage2_steps",), (TWO_STAGE, HQ, EXTEND_DEV)),
    Modifier("--cfg-scale … (guidance)", "the video's and the joint passes' guidance, --stage1-steps, APG",
             VIDEO_KNOBS, (*GUIDED, *GUIDED_CLIP)),
    Modifier("--audio-modality-scale", "the audio stream's modality guidance (it reads the video)",
             ("audio_modality_scale",), (*GUIDED, *GUIDED_CLIP)),
    Modifier("--steps … (steps)", "steps, the negative prompt, the STG blocks and the audio's skip step",
             SHARED_KNOBS, (*GUIDED, *GUIDED_CLIP, T2A)),
    Modifier("--audio-cfg-scale … (audio guidance)", "the audio's guidance scales", AUDIO_SCALES, (*GUIDED, *GUIDED_CLIP, T2A)),
    Modifier("--segment", "a prompt per moment (Prompt Relay: each segment's text held to its seconds)",
             ("segments",), (DISTILLED, *GUIDED)),
    Modifier("--relay-epsilon … (relay)", "Prompt Relay's falloff and strength", ("relay_epsilon", "relay_strength"),
             (DISTILLED, *GUIDED), needs=("--segment",), rule="they shape the segments' penalty"),
    Modifier("--stage1-parallel", "stage 1 sequence-parallel over K Macs (reference tokens split with the video's; "
             "a guided stage 1 each pass's forward)", ("stage1_parallel",),
             (DISTILLED, DFR, RETAKE, EXTEND, IC_LORA, DUB_IT, HDR, *GUIDED, *GUIDED_CLIP), on=_sp),
    Modifier("--temporal-upscalings", "DFR's temporal rounds", ("temporal_upscalings",), (DFR,)),
    Modifier("--spatial-upscalings 2", "DFR's spatial epilogue", ("spatial_upscalings",),
             (DFR, RETAKE, EXTEND, IC_LORA, DUB_IT), on=_epilogue, excludes=("--chunked",),
             rule="DFR's canvas and epilogue span the whole clip"),
    Modifier("--detailing-lora", "DFR's stage-2 detailing IC-LoRA", ("detailing_lora",),
             (DFR, RETAKE, EXTEND, IC_LORA, DUB_IT), needs=DFR_STAGES, rule="it details DFR's stage 2"),
    Modifier("--num-generated-keyframes", "LTX-2.5 generated keyframe slots in stage 1 (carried into stage 2 for "
             "the diffusion decoder, which reads them as keyframes)", ("num_generated_keyframes",),
             (DISTILLED, *GUIDED, IC_LORA, DUB_IT), excludes=DFR_STAGES, rule="DFR places its own keyframe slots",
             why_not=((DFR, "it places its own keyframe slots"),
                      (HDR, "it places its own keyframe slots at the clip's seams, and a stage takes one slot set"))),
    Modifier("--video-decoder diffusion", "LTX-2.5's diffusion decoder, keyframe-aware (DFR's planes, HDR's seam "
             "slots, else the --image keyframes past frame 0)", ("video_decoder",), VIDEO, on=_diffusion),
    Modifier("--sparse-attention", "sparse stage-2 attention (taus per step)", ("sparse_attention",),
             _except(HDR)),  # the grade has no stage 2
    Modifier("--compute-dtype", "the DiT's attention / FF dtype", ("compute_dtype",), VIDEO),
    Modifier("--decode-tiles", "the VAE decode's tiles", ("decode_tiles",), VIDEO),
    Modifier("--encode-tiles", "a source clip's tiled encode", ("encode_tiles",), VIDEO),
    Modifier("--exr", "EXR frames (and their colourspace)", ("exr", "exr_colorspace"), VIDEO),
    Modifier("--hdr", "an HLG 10-bit HEVC master", ("hdr",), VIDEO),
    Modifier("--chunked", "a clip longer than one window: windows each conditioned on the last frames (and audio) "
             "of the one before, the seams crossfaded; keyframes each in the window that makes its frame; a "
             "control clip or Dub-It reference sliced to each window's frames",
             CHUNK_FIELDS, (DISTILLED, *GUIDED, IC_LORA, DUB_IT),
             excludes=("--num-generated-keyframes", "--stage1-parallel", "--video-decoder diffusion"),
             rule="a window is conditioned on the one before and its own keyframes alone"),
)


def is_on(mod: Modifier, spec: RenderPlan) -> bool:
    """Whether a spec asks for this modifier."""
    if mod.on is not None:
        return mod.on(spec)
    return any(_given(_value(spec, name)) for name in mod.fields)


def given_flag(mod: Modifier, spec: RenderPlan) -> str:
    """The flag the user gave: a group's first given field, else the modifier's own."""
    if len(mod.fields) > 1 and mod.on is None:
        name = next(n for n in mod.fields if _given(_value(spec, n)))
        return "--" + name.replace("_", "-")
    return mod.flag


def taken_by(recipe: Recipe) -> tuple[Modifier, ...]:
    """The modifiers a recipe composes with (read from the one table)."""
    return tuple(m for m in MODIFIERS if recipe.name in m.recipes and m.selects != recipe.name)


def takes(recipe: Recipe, flag: str) -> bool:
    """Whether the recipe composes with the modifier of this flag."""
    return any(m.flag == flag for m in taken_by(recipe))


def refusal(recipe: Recipe, spec: RenderPlan) -> str | None:
    """The one line for the first modifier the chosen recipe does not take, else for the first that needs
    or excludes another; None when all compose."""
    on = [mod for mod in MODIFIERS if is_on(mod, spec)]
    for mod in on:
        if recipe.name in mod.recipes:
            continue
        flag = given_flag(mod, spec)
        if mod.selects is not None:  # the why, when the other recipe is the pipeline's alone (not a second input)
            alone = sum(m.selects is not None for m in on) == 1
            why = f" ({mod.picks_rule})" if mod.picks_rule and alone else ""
            return f"{flag} and {recipe.flag} are two recipes: give one{why}"
        takers, why = ", ".join(mod.recipes), dict(mod.why_not).get(recipe.name)
        said = f"{recipe.flag}: {why}" if why else recipe.flag
        return f"{flag} does not apply to the {recipe.name} recipe ({said}); it applies to: {takers}"
    by_flag = {mod.flag: mod for mod in on}
    given = set(by_flag)
    for mod in on:
        clash = next((by_flag[f] for f in mod.excludes if f in by_flag), None)
        if clash is not None:
            return f"{given_flag(mod, spec)} and {given_flag(clash, spec)} do not compose ({mod.rule})"
        if mod.needs and not given & set(mod.needs):
            return f"{given_flag(mod, spec)} needs one of {', '.join(mod.needs)} ({mod.rule})"
    return None
