"""The job compiler: a RenderSpec becomes a stage graph of tasks. Pure: no Redis, no gRPC, no models.

Task dicts are what the store keeps: id, kind, params, inputs ({name: {"blob": sha}} or
{name: {"task": id, "output": name}}), deps, capability. `params["expect"]` names each output's dtype
and shape (-1 = not known here) so the scheduler can refuse a malformed result.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from types import MappingProxyType

from coordinator.plan import costs, placement, samplers, sp_degree, sparse
from coordinator.plan.clip import check_clip_spec, clip_pipeline, plan_clip
from coordinator.plan.control import check_control, wire_control
from coordinator.plan.decode import decode_peak_bytes, plan_decode, resolve_decode_tiles
from coordinator.plan.dfr import (
    canvas_frames,
    check_dfr,
    detailing_params,
    dfr_on,
    output_frames,
    plan_slot_upsample,
    slot_expect,
    slot_params,
)
from coordinator.plan.dfr_finish import keyframe_decode_io, plan_dfr_finish, stage_view
from coordinator.plan.diffusion_decode import check_video_decoder, is_diffusion
from coordinator.plan.graph import (  # noqa: F401 - SpecError and the constants are part of this module's surface
    SPATIAL_FACTOR,
    TEMPORAL_FACTOR,
    SpecError,
    audio_latent_frames,
    expect,
    latent_frames,
    ref,
    task,
)
from coordinator.plan.guidance import check_recipe
from coordinator.plan.guided_checks import check_guided_extras
from coordinator.plan.guided_render import contexts_of, guided_stage2, negative_text_task, plan_guided_stage1
from coordinator.plan.hdr import check_hdr, is_hdr, plan_hdr
from coordinator.plan.images import (
    generated_slot_params,
    generated_slots,
    plan_image_encodes,
    resolved_images,
)
from coordinator.plan.length import (
    check_auto_duration,
    length_pending,
    plan_length_phase,
    probe_spec,
    settled,
)
from coordinator.plan.loras import with_loras
from coordinator.plan.media import a2v_negative, check_media, plan_video_encode, wire_audio
from coordinator.plan.outputs import check_exr_colorspace
from coordinator.plan.resolved import RenderPlan, Resolved
from coordinator.plan.stage2 import check_tiling, plan_tiled_stage2, stage2_sigmas
from ltx_engine import text_encoders
from ltx_engine.components import TEXT_ENCODER, missing_line, render_components
from ltx_engine.generation import check_generation, stage1_sampler
from ltx_engine.sampling import DISTILLED_SIGMAS
from protos.spec import RenderSpec, spec_field_names

MAX_SIDE = 2048          # the reference's spatial positional range (pixels)
MAX_SECONDS = 20.0       # the reference's temporal positional range (seconds)
MAX_FRAMES = 1 + 8 * 64
DEFAULT_FRAMES = 25

DEFAULTS = MappingProxyType(RenderSpec().to_dict())  # the record's field defaults, read-only
Spec = Mapping  # what the planning functions read: a RenderPlan (spec + resolved), or a plain mapping in tests


def normalize_spec(raw: Mapping | RenderSpec) -> RenderPlan:
    """The typed spec (defaults filled in, numbers typed; unknown keys refused), nothing resolved yet:
    read as a mapping like every plan."""
    if isinstance(raw, RenderPlan):
        return raw
    return RenderPlan(raw if isinstance(raw, RenderSpec) else RenderSpec.from_dict(raw))


def estimate_peak_bytes(spec: Spec) -> int:
    """A coarse upper estimate of a worker's peak memory for the untiled stage 2 and the (tiled) decode."""
    tokens = latent_frames(spec["frames"]) * (spec["height"] // 32) * (spec["width"] // 32)
    return tokens * 4096 * 2 * 64 + decode_peak_bytes(spec)


def validate_spec(spec: RenderSpec | RenderPlan, fleet: list[dict], known: Resolved | None = None) -> RenderPlan:
    """Refuse what cannot render, with one line that says why; else what the planner resolved for it
    (the spec itself is never changed). `fleet`: registered workers' capabilities; `known`: what is
    resolved already (the local runner's generation, the length the DurationHead picked)."""
    plan = spec if isinstance(spec, RenderPlan) else RenderPlan(spec, known or Resolved())
    if not str(plan.get("prompt", "")).strip():
        raise SpecError("prompt is empty: give one with -p/--prompt")
    plan = plan.resolve(generation=resolve_generation(plan, fleet))
    check_exr_colorspace(plan)
    check_auto_duration(plan)
    if is_hdr(plan) and plan["frames"] is None:  # issue #29: the clip's length is the user's to give
        raise SpecError("--hdr-ic-lora renders the clip's first -f frames: give -f N (8k+1, e.g. 25)")
    if length_pending(plan):  # the head picks the length on the farm: check the rest at the shortest it can pick
        return plan.resolve(**settled(_validate_sized(probe_spec(plan, fleet), fleet)))
    if plan["frames"] is None:  # a left-out length on a pack not known to be LTX-2.5 is DEFAULT_FRAMES, as always
        plan = plan.resolve(frames=DEFAULT_FRAMES)
    return _validate_sized(plan, fleet)


def _validate_sized(spec: RenderPlan, fleet: list[dict]) -> RenderPlan:
    """The checks of a render whose length is known, and what they resolve."""
    for key in ("height", "width"):
        value = spec[key]
        if value <= 0 or value % 64:
            near = max(64, round(value / 64) * 64) if value > 0 else 64
            raise SpecError(f"{key} {value} is not a positive multiple of 64 (two-stage renders halve it for "
                            f"stage 1): try {near}")
        if value > MAX_SIDE:
            raise SpecError(f"{key} {value} is beyond the model's {MAX_SIDE} px positional range")
    frames = spec["frames"]
    if frames < 1 or (frames - 1) % TEMPORAL_FACTOR:
        raise SpecError(f"frames {frames} is not of the form 8k+1 (e.g. 25, 49, 97, 121)")
    if frames > MAX_FRAMES or frames / spec["frame_rate"] > MAX_SECONDS:
        raise SpecError(f"{frames} frames at {spec['frame_rate']} fps exceed the model's {MAX_SECONDS:.0f} s range")
    if spec["frame_rate"] <= 0:
        raise SpecError("frame rate must be positive")
    if spec["seed"] < 0:
        raise SpecError(f"seed {spec['seed']} is negative")
    resolved_images(spec)  # keyframes: frames inside the clip, one replace per latent frame (plan/images.py)
    generated_slots(spec)  # --num-generated-keyframes: LTX-2.5, no DFR, slots that fit
    check_media(spec)  # issue #24: what A2V builds, the source's encode tiles (plan/media.py)
    check_control(spec)  # issue #24: IC-LoRA control / Dub-It: its LoRA, reference sizes (plan/control.py)
    spec = spec.resolve(**check_clip_spec(spec))  # issue #24 retake/extend (plan/clip.py)
    check_hdr(spec)  # issue #29: the HDR IC-LoRA render's refusals (plan/hdr.py)
    spec = spec.resolve(text_encoder=resolve_text_encoder(spec, fleet))
    _check_guided(spec)
    check_video_decoder(spec)  # issue #29: --video-decoder diffusion on LTX-2.5 only
    _check_components(spec, fleet)
    spec = spec.resolve(**check_dfr(spec, fleet))
    spec = spec.resolve(decode_tiles=resolve_decode_tiles(spec, fleet))
    spec = spec.resolve(stage2_tiles=check_tiling(spec, fleet))  # first: _check_fleet refuses by its tiles' peaks
    sparse.check_forward_settings(spec, len(stage2_sigmas(spec)) - 1)  # issue #26
    spec = spec.resolve(pack_bytes=_check_fleet(spec, fleet))
    return spec.resolve(assemble_s=round(costs.assemble_seconds(spec), 4))


def _check_guided(spec: RenderPlan) -> None:
    """A guided recipe's refusals (plan/guidance.py), and what the farm does not build for it yet."""
    if check_recipe(spec) is None:
        return
    check_guided_extras(spec)  # plan/guided_checks.py (issue #23)
    for key, flag in (("stage2_tiles", "--stage2-tiles"), ("stage2_sigmas", "--stage2-sigmas"),
                      ("detailing_lora", "--detailing-lora")):
        if spec.get(key) is not None and spec["pipeline"] == "one-stage":
            raise SpecError(f"{flag} is a stage-2 option; --pipeline one-stage has no stage 2")
    if int(spec.get("temporal_upscalings") or 0):
        raise SpecError("--temporal-upscalings (DFR) runs after the distilled pipeline only")


def _check_fleet(spec: RenderPlan, fleet: list[dict]) -> int | None:
    """Refuse a render no registered worker can hold; the pack's bytes as its holders report them."""
    if not fleet:
        return spec.resolved.pack_bytes  # nobody registered yet: the render waits for workers
    holders = [w for w in fleet if spec["pack"] in (w.get("packs") or [])]
    if not holders:
        raise SpecError(f"unknown pack {spec['pack']!r}: no registered worker has it")
    pack_bytes = placement.fleet_pack_bytes(spec["pack"], holders)
    if pack_bytes:  # the cost model, per task, against what each worker can use
        placement.refuse_oversize(spec, plan_render(spec.resolve(pack_bytes=pack_bytes), "check"), holders)
        return pack_bytes
    largest = max(int(w.get("memory_bytes") or 0) for w in holders)
    need = estimate_peak_bytes(spec)
    if largest and need > largest:
        raise SpecError(
            f"{spec['width']}x{spec['height']}x{spec['frames']} needs ~{need / 2**30:.1f} GiB on one worker; "
            f"the largest holding {spec['pack']!r} has {largest / 2**30:.1f} GiB"
        )
    return pack_bytes


def resolve_generation(spec: Spec, fleet: list[dict]) -> str | None:
    """The pack's LTX generation as the live workers report it (`pack_generation`), once per
    render; holders that disagree refuse it. With no worker describing the pack a value already set (the
    local runner's) stays, else None: each stage-1 task then reads it from its own pack."""
    pack = spec["pack"]
    seen = {w["pack_generation"][pack] for w in fleet if pack in (w.get("pack_generation") or {})}
    if len(seen) > 1:
        raise SpecError(f"workers disagree on the LTX generation of pack {pack!r} ({', '.join(sorted(seen))}): "
                        "they hold different packs under one name")
    return check_generation(seen.pop()) if seen else spec.get("generation")


def continue_render(stored: Mapping, frames: int, seconds: float, render_id: str, fleet: list[dict],
                    ) -> tuple[dict, list[dict]]:
    """Phase 2 of a render whose DurationHead picked its length: the spec recorded at submit (asked
    fields and what submit settled) with that length, checked again; its stored view and its whole
    graph (the text task is already there)."""
    asked = RenderSpec.from_dict({k: v for k, v in stored.items() if k in spec_field_names()})
    known = Resolved(generation=stored.get("generation"), pack_bytes=stored.get("pack_bytes"), frames=frames,
                     predicted_seconds=seconds)
    plan = validate_spec(asked, fleet, known)
    return plan.as_dict(), plan_render(plan, render_id)


def resolve_text_encoder(spec: Spec, fleet: list[dict]) -> str | None:
    """The render's text encoder (the pack's own tower wins, as the live workers
    describe the pack) and refuse, in one line with the command that fetches it, a separate encoder no
    live worker holds. Workers that do not describe their encoders pass."""
    pack = spec["pack"]
    described = [w for w in fleet if pack in (w.get("pack_components") or {})]
    has_tower = any(TEXT_ENCODER in w["pack_components"][pack] for w in described) if described else None
    ref = text_encoders.resolve(has_tower, spec.get("text_encoder"))
    if ref in (None, text_encoders.PACK):
        return ref
    holders = [w["text_encoders"] for w in fleet if isinstance(w.get("text_encoders"), dict)]
    if holders and not any(name in held for held in holders for name in text_encoders.names(ref)):
        raise SpecError(text_encoders.refusal(ref, pack))
    return ref


def text_params(spec: Spec) -> dict:
    """The text task's encoder params: the choice, and the names a worker may hold a separate one under."""
    ref = spec.get("text_encoder")
    if ref is None:
        return {}
    return {"text_encoder": ref} if ref == text_encoders.PACK else {
        "text_encoder": ref, "text_encoder_names": text_encoders.names(ref)}


def text_key(spec: Spec) -> str:
    """The prompt-embedding cache's key: what a text task's outputs depend on (pack as the fleet holds
    it, prompt, encoder choice). Equal keys reuse one encoding (lease.lua, complete.lua): a seed sweep
    or a retry does not encode its prompt again."""
    parts = [spec["pack"], spec.get("generation"), spec.get("pack_bytes"), spec.get("text_encoder"), spec["prompt"]]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _check_components(spec: Spec, fleet: list[dict]) -> None:
    """Refuse a render whose pack lacks a component it needs on every worker holding it, with the
    one line that names the missing file and how to get it (or why the worker cannot serve it).
    Workers that do not describe their pack's components pass (the scheduler still matches tasks)."""
    pack = spec["pack"]
    described = [w for w in fleet if pack in (w.get("pack_components") or {})]
    if not described:
        return
    held = {c for w in described for c in w["pack_components"][pack]}
    for component in render_components(spec):
        if component not in held:
            problems = [(w.get("pack_problems") or {}).get(pack) or {} for w in described]
            why = next((p.get(component) or p.get("pack") for p in problems if p.get(component) or p.get("pack")), None)
            raise SpecError(why or missing_line(component, pack))


def plan_render(spec: Spec | RenderSpec, render_id: str) -> list[dict]:
    """The distilled two-stage text/image-to-video graph with audio, in a topological order: of a
    validated RenderPlan (a RenderSpec alone plans as asked, unresolved)."""
    if isinstance(spec, RenderSpec):
        spec = RenderPlan(spec)
    rid = render_id
    pack = spec["pack"]
    text_id = f"{rid}.text"
    ctx = {k: ref(text_id, k) for k in ("video_context", "audio_context", "context_mask")}
    tasks = [task(rid, "text", "text_encode", {"pack": pack, "prompt": spec["prompt"], **text_params(spec),
                                               "text_key": text_key(spec),
                   "expect": {k: expect("float32") for k in ctx}}, {})]
    if spec["frames"] is None:  # an LTX-2.5 render's length is picked first (plan_length)
        return with_loras(plan_length_phase(rid, spec, tasks[0]), spec)
    if is_hdr(spec):  # issue #29: the HDR IC-LoRA render is its own graph (plan/hdr.py)
        return _finish(plan_hdr(rid, spec, tasks[0]), spec, rid)
    if clip_pipeline(spec):  # issue #24 retake/extend: their own graphs (plan/clip.py)
        return _finish([*tasks, *plan_clip(rid, spec, ctx)], spec, rid)
    encodes, cond1, cond2, image_params = plan_image_encodes(rid, spec)  # two per image (plan/images.py)
    tasks.extend(encodes)
    tasks.extend(plan_video_encode(rid, spec)[0])  # issue #24: a source clip's tiled encode (plan/media.py)
    s1 = f"{rid}.stage1"
    guided = check_recipe(spec)
    one_stage = guided is not None and guided.pipeline == "one-stage"
    if guided is not None:  # the dev DiT's guided stage 1 (plan/guided_render.py)
        tasks.append(negative_text_task(rid, spec, guided, tasks[0], text_key))
        guided_ctx = (ctx, a2v_negative(spec, contexts_of(f"{rid}.negative"), ctx))  # plan/media.py
    if one_stage:  # at full resolution, decoded as it is
        tasks = [t for t in tasks if not (t["kind"] == "image_encode" and t["id"].endswith("_s1"))]
        tasks.extend(plan_guided_stage1(rid, spec, guided, *guided_ctx, cond2, image_params, spec["height"],
                                        spec["width"]))
    else:
        tasks.extend(_plan_stages(rid, stage_view(spec), ctx, cond1, cond2, image_params,
                                  (guided, *guided_ctx) if guided is not None else None))
        tasks = tasks if guided is None else guided_stage2(tasks, rid, guided, ctx)  # plan/guided_render.py
    final, decode_spec, keyframes = ref(s1 if one_stage else f"{rid}.stage2", "video_latent"), spec, None
    if dfr_on(spec):  # rounds, base path or epilogue; the trimmed latent (plan/dfr_finish.py)
        dfr_tasks, final = plan_dfr_finish(rid, spec, ctx, cond2, image_params)
        tasks.extend(dfr_tasks)
        decode_spec = {**spec, "frames": output_frames(spec)}
        if is_diffusion(spec):  # the keyframe-aware decode: each task its planes (issue #29)
            keyframes = functools.partial(keyframe_decode_io, rid, spec)
    tasks.extend(plan_decode(rid, decode_spec, final, keyframes))
    if spec.get("audio", True):
        tasks.append(task(rid, "audio", "decode_audio", {
            "pack": pack, "product": "audio", "expect": {"waveform": expect("float32", -1, -1),
                                                         "sample_rate": expect("int32", 1)}},
            {"latent": ref(s1, "audio_latent")}))
    return _finish(wire_audio(tasks, rid, spec), spec, rid)  # issue #24: A2V's frozen source track (plan/media.py)


def _finish(tasks: list[dict], spec: Spec, rid: str) -> list[dict]:
    with_loras(tasks, spec)  # user LoRAs on every DiT task (plan/loras.py)
    tasks = wire_control(tasks, rid, spec)  # issue #24: the reference encodes, the IC-LoRA (plan/control.py)
    costs.annotate(tasks, spec)
    return tasks


def _stage1_sampler(spec: Spec) -> dict:
    """Stage 1's sampler from the recorded generation; nothing when it is not known (the worker reads
    its pack's)."""
    generation = spec.get("generation")
    return {"sampler": stage1_sampler(generation, dfr_on(spec))} if generation else {}


def _plan_stages(rid: str, spec: Spec, ctx: dict, cond1: dict, cond2: dict, image_params: dict,
                 guided: tuple | None = None) -> list[dict]:
    """Stage 1, the spatial upsample and stage 2 (on DFR's padded canvas, with its keyframe slots);
    `guided` (recipe, prompt contexts, negative contexts): stage 1 is the dev recipe's guided stage."""
    pack, seed, fps = spec["pack"], spec["seed"], spec["frame_rate"]
    frames, slots = canvas_frames(spec), slot_params(spec)
    f_lat, a_lat = latent_frames(frames), audio_latent_frames(frames, fps)
    h2, w2 = spec["height"] // 2, spec["width"] // 2
    shape1 = (1, -1, f_lat, h2 // SPATIAL_FACTOR, w2 // SPATIAL_FACTOR)
    shape2 = (1, -1, f_lat, spec["height"] // SPATIAL_FACTOR, spec["width"] // SPATIAL_FACTOR)
    s1 = f"{rid}.stage1"
    generated, generated_expect = generated_slot_params(spec, h2, w2)  # --num-generated-keyframes (plan/images.py)
    tasks = [task(rid, "stage1", "denoise_stage1", {
        "pack": pack, "seed": seed, "frames": frames, "fps": fps, "height": h2, "width": w2,
        "sigmas": list(DISTILLED_SIGMAS), "audio_frames": a_lat, **image_params, **slots, **generated,
        **_stage1_sampler(spec), **sparse.stage1_params(spec),
        **sp_degree.stage1_params(spec, f_lat * (h2 // SPATIAL_FACTOR) * (w2 // SPATIAL_FACTOR),
                                  len(DISTILLED_SIGMAS) - 1),  # issue #25: its gang cap
        "expect": {"video_latent": expect("float32", *shape1), "audio_latent": expect("float32", 1, -1, a_lat, -1),
                   **slot_expect(spec, h2, w2), **generated_expect}},
        {**ctx, **cond1})]
    if guided is not None:
        tasks = plan_guided_stage1(rid, spec, guided[0], guided[1], guided[2], cond1, image_params, h2, w2)
    tasks.append(task(rid, "upsample", "upsample_spatial", {
        "pack": pack, "expect": {"latent": expect("float32", *shape2)}}, {"latent": ref(s1, "video_latent")}))
    tasks += plan_slot_upsample(rid, spec, ref(s1, "slots"))
    stage2_params = {"pack": pack, "seed": seed, "frames": frames, "fps": fps, "height": spec["height"],
                     "width": spec["width"], "sigmas": stage2_sigmas(spec), "audio_frames": a_lat,
                     "noise_stream": 1, **image_params, **slots, **sparse.stage2_params(spec),
                     **samplers.stage2_params(spec)}
    stage2_inputs = {**cond2, "latent": ref(f"{rid}.upsample", "latent"), "audio_latent": ref(s1, "audio_latent")}
    if slots:  # upstream's DFR stage 2: slots from stage 1's, upsampled; audio re-noised and denoised along
        # tiled: frozen, as TDP's audio; A2V: the source track frozen, as in stage 1
        stage2_params["renoise_audio"] = spec.get("stage2_tiles") is None and not spec.get("audio_input")
        stage2_inputs["slots"] = ref(f"{rid}.upsample.slots", "latent")
        stage2_params |= detailing_params(spec)
        if spec.get("detailing_lora"):  # the IC-LoRA's reference: stage 1's half-resolution video
            stage2_inputs["reference_latent"] = ref(s1, "video_latent")
    if spec.get("stage2_tiles") is None:
        tasks.append(task(rid, "stage2", "denoise_stage2", {
            **stage2_params, "expect": {"video_latent": expect("float32", *shape2),
                                        **slot_expect(spec, spec["height"], spec["width"])}},
            {**ctx, **stage2_inputs}))
    else:
        tasks.extend(plan_tiled_stage2(rid, spec, stage2_params, stage2_inputs, ctx))
    return tasks


def stage_latent_outputs() -> dict[str, tuple[str, str]]:
    """The latents `--save-latents` writes, by file stem → (task name suffix, output name)."""
    return {"stage1_video": ("stage1", "video_latent"), "stage1_audio": ("stage1", "audio_latent"),
            "upsampled": ("upsample", "latent"), "stage2_video": ("stage2", "video_latent")}
