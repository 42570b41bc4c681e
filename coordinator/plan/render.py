"""The job compiler: a RenderSpec becomes a stage graph of tasks. Pure: no Redis, no gRPC, no models.

Task dicts are what the store keeps: id, kind, params, inputs ({name: {"blob": sha}} or
{name: {"task": id, "output": name}}), deps, capability. `params["expect"]` names each output's dtype
and shape (-1 = not known here) so the scheduler can refuse a malformed result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from coordinator.plan import costs, placement, sparse
from coordinator.plan.build import Prompt
from coordinator.plan.chunks import check_chunks, check_window_tiling, chunked, window_view
from coordinator.plan.decode import decode_peak_bytes, resolve_decode_tiles
from coordinator.plan.dfr import (
    check_dfr,
)
from coordinator.plan.diffusion_decode import check_video_decoder
from coordinator.plan.enhance import check_enhancer, fleet_has_head, plan_enhance
from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import (  # noqa: F401 - SpecError and the constants are part of this module's surface
    SPATIAL_FACTOR,
    TEMPORAL_FACTOR,
    SpecError,
    expect,
    latent_frames,
    ref,
    task,
)
from coordinator.plan.hdr import is_hdr
from coordinator.plan.images import (
    generated_slots,
    resolved_images,
)
from coordinator.plan.length import (
    check_auto_duration,
    length_pending,
    plan_length_phase,
    probe_spec,
    settled,
)
from coordinator.plan.loras import lora_text
from coordinator.plan.media import check_media
from coordinator.plan.outputs import check_exr_colorspace
from coordinator.plan.recipes import PackFacts, check_recipe_spec, recipe_for
from coordinator.plan.relay import check_relay, with_relay
from coordinator.plan.resolved import RenderPlan, Resolved
from coordinator.plan.stage2 import stage2_sigmas
from ltx_engine.rules import text_encoders
from ltx_engine.rules.components import TEXT_ENCODER, missing_line, render_components
from ltx_engine.rules.generation import check_generation
from protos.spec import RenderSpec, spec_field_names

MAX_SIDE = 2048          # the reference's spatial positional range (pixels)
MAX_SECONDS = 20.0       # the reference's temporal positional range (seconds)
MAX_FRAMES = 1 + 8 * 64
DEFAULT_FRAMES = 25

DEFAULTS = MappingProxyType(RenderSpec().to_dict())  # the record's field defaults, read-only


def normalize_spec(raw: Mapping | RenderSpec) -> RenderPlan:
    """The typed spec (defaults filled in, numbers typed; unknown keys refused), nothing resolved yet:
    read by attribute like every plan."""
    if isinstance(raw, RenderPlan):
        return raw
    return RenderPlan(raw if isinstance(raw, RenderSpec) else RenderSpec.from_dict(raw))


def estimate_peak_bytes(spec: RenderPlan) -> int:
    """A coarse upper estimate of a worker's peak memory for the untiled stage 2 and the (tiled) decode."""
    tokens = latent_frames(spec.frames) * (spec.height // 32) * (spec.width // 32)
    return tokens * 4096 * 2 * 64 + decode_peak_bytes(spec)


def validate_spec(spec: RenderSpec | RenderPlan, fleet: Fleet | Iterable[Mapping],
                  known: Resolved | None = None) -> RenderPlan:
    """Refuse what cannot render, with one line that says why; else what the planner resolved for it
    (the spec itself is never changed). `fleet`: the registered workers (`Fleet.of` their capability
    dicts, as the callers that enter the planner build it); `known`: what is resolved already (the local
    runner's generation, the length the DurationHead picked)."""
    plan = spec if isinstance(spec, RenderPlan) else RenderPlan(spec, known or Resolved())
    fleet = Fleet.of(fleet)
    if not plan.prompt.strip():
        raise SpecError("prompt is empty: give one with -p/--prompt")
    plan = plan.resolve(generation=resolve_generation(plan, fleet))
    check_exr_colorspace(plan)
    check_auto_duration(plan)
    if is_hdr(plan) and plan.frames is None:  # the clip's length is the user's to give
        raise SpecError("--hdr-ic-lora renders the clip's first -f frames: give -f N (8k+1, e.g. 25)")
    if length_pending(plan) and not recipe_for(plan).video:  # the head reads both contexts; T2A's upstream, audio's
        raise SpecError("--pipeline t2a needs -f/--frames (its length, at --frame-rate): the duration head's "
                        "audio-only pick is not on the farm")
    if length_pending(plan):  # the head picks the length on the farm: check the rest at the shortest it can pick
        return plan.resolve(**settled(_validate_sized(probe_spec(plan, fleet), fleet)))
    if plan.frames is None:  # a left-out length on a pack not known to be LTX-2.5 is DEFAULT_FRAMES, as always
        plan = plan.resolve(frames=DEFAULT_FRAMES)
    return _validate_sized(plan, fleet)


def _validate_sized(spec: RenderPlan, fleet: Fleet) -> RenderPlan:
    """The checks of a render whose length is known, and what they resolve."""
    for key, value in (("height", spec.height), ("width", spec.width)):
        if value <= 0 or value % 64:
            near = max(64, round(value / 64) * 64) if value > 0 else 64
            raise SpecError(f"{key} {value} is not a positive multiple of 64 (two-stage renders halve it for "
                            f"stage 1): try {near}")
        if value > MAX_SIDE:
            raise SpecError(f"{key} {value} is beyond the model's {MAX_SIDE} px positional range")
    frames = spec.frames
    if frames < 1 or (frames - 1) % TEMPORAL_FACTOR:
        raise SpecError(f"frames {frames} is not of the form 8k+1 (e.g. 25, 49, 97, 121)")
    if chunked(spec):  # a recipe that chunks and windows that lay out: the range below is one window's
        check_recipe_spec(spec, PackFacts(spec.pack, spec.generation))
        check_chunks(spec)
    frames = window_view(spec).frames
    if frames > MAX_FRAMES or frames / spec.frame_rate > MAX_SECONDS:
        raise SpecError(f"{frames} frames at {spec.frame_rate} fps exceed the model's {MAX_SECONDS:.0f} s range")
    if spec.frame_rate <= 0:
        raise SpecError("frame rate must be positive")
    if spec.seed < 0:
        raise SpecError(f"seed {spec.seed} is negative")
    pack = PackFacts(spec.pack, spec.generation)
    resolved = check_recipe_spec(spec, pack)  # the recipe's modifiers and its own rules (plan/recipes/)
    resolved_images(spec)  # keyframes: frames inside the clip, one replace per latent frame (plan/images.py)
    check_relay(spec)  # --segment: inside the clip, a latent frame each (plan/relay.py)
    generated_slots(spec)  # --num-generated-keyframes: LTX-2.5, no DFR, slots that fit
    check_chunks(spec)  # the chunk flags only with --chunked (plan/chunks.py)
    check_media(spec)  # A2V's frozen track, the source's encode tiles (plan/media.py)
    spec = spec.resolve(**resolved, text_encoder=resolve_text_encoder(spec, fleet))
    check_enhancer(spec, fleet_has_head(spec, fleet))  # --enhance-prompt: a pack's Gemma that writes
    check_video_decoder(spec)  # --video-decoder diffusion on LTX-2.5 only
    _check_components(spec, fleet)
    spec = spec.resolve(**check_dfr(spec, fleet))
    spec = spec.resolve(decode_tiles=resolve_decode_tiles(window_view(spec), fleet))  # a window's, when chunked
    spec = spec.resolve(stage2_tiles=check_window_tiling(spec, fleet))  # before _check_fleet's peaks
    sparse.check_forward_settings(window_view(spec), len(stage2_sigmas(spec)) - 1)
    spec = spec.resolve(pack_bytes=_check_fleet(spec, fleet))
    return spec.resolve(assemble_s=round(costs.assemble_seconds(spec), 4))


def _check_fleet(spec: RenderPlan, fleet: Fleet) -> int | None:
    """Refuse a render no registered worker can hold; the pack's bytes as its holders report them."""
    if not fleet:
        return spec.resolved.pack_bytes  # nobody registered yet: the render waits for workers
    holders = fleet.holders(spec.pack)
    if not holders:
        raise SpecError(f"unknown pack {spec.pack!r}: no registered worker has it")
    pack_bytes = holders.pack_bytes(spec.pack)
    if pack_bytes:  # the cost model, per task, against what each worker can use
        placement.refuse_oversize(spec, plan_render(spec.resolve(pack_bytes=pack_bytes), "check"), holders)
        return pack_bytes
    largest = holders.largest_memory()
    need = estimate_peak_bytes(window_view(spec))
    if largest and need > largest:
        raise SpecError(
            f"{spec.width}x{spec.height}x{spec.frames} needs ~{need / 2**30:.1f} GiB on one worker; "
            f"the largest holding {spec.pack!r} has {largest / 2**30:.1f} GiB"
        )
    return pack_bytes


def resolve_generation(spec: RenderPlan, fleet: Fleet) -> str | None:
    """The pack's LTX generation as the live workers report it (`pack_generation`), once per
    render; holders that disagree refuse it. With no worker describing the pack a value already set (the
    local runner's) stays, else None: each stage-1 task then reads it from its own pack."""
    pack = spec.pack
    seen = fleet.generations(pack)
    if len(seen) > 1:
        raise SpecError(f"workers disagree on the LTX generation of pack {pack!r} ({', '.join(sorted(seen))}): "
                        "they hold different packs under one name")
    return check_generation(seen.pop()) if seen else spec.generation


def continue_render(stored: Mapping, frames: int, seconds: float, render_id: str, fleet: Fleet,
                    ) -> tuple[dict, list[dict]]:
    """Phase 2 of a render whose DurationHead picked its length: the spec recorded at submit (asked
    fields and what submit settled) with that length, checked again; its stored view and its whole
    graph (the text task is already there)."""
    asked = RenderSpec.from_dict({k: v for k, v in stored.items() if k in spec_field_names()})
    known = Resolved(generation=stored.get("generation"), pack_bytes=stored.get("pack_bytes"), frames=frames,
                     predicted_seconds=seconds)
    plan = validate_spec(asked, fleet, known)
    return plan.as_dict(), plan_render(plan, render_id)


def resolve_text_encoder(spec: RenderPlan, fleet: Fleet) -> str | None:
    """The render's text encoder (the pack's own tower wins, as the live workers
    describe the pack) and refuse, in one line with the command that fetches it, a separate encoder no
    live worker holds. Workers that do not describe their encoders pass."""
    pack = spec.pack
    components = fleet.components(pack)
    ref = text_encoders.resolve(None if components is None else TEXT_ENCODER in components, spec.text_encoder)
    if ref in (None, text_encoders.PACK):
        return ref
    held = fleet.text_encoders()
    if held is not None and not any(name in held for name in text_encoders.names(ref)):
        raise SpecError(text_encoders.refusal(ref, pack))
    return ref


def text_params(spec: RenderPlan) -> dict:
    """The text task's encoder params: the choice, and the names a worker may hold a separate one under."""
    ref = spec.text_encoder
    if ref is None:
        return {}
    return {"text_encoder": ref} if ref == text_encoders.PACK else {
        "text_encoder": ref, "text_encoder_names": text_encoders.names(ref)}


def text_key(spec: RenderPlan) -> str:
    """The prompt-embedding cache's key: what a text task's outputs depend on (pack as the fleet holds
    it, prompt, encoder choice). Equal keys reuse one encoding (lease.lua, complete.lua): a seed sweep
    or a retry does not encode its prompt again."""
    parts = [spec.pack, spec.generation, spec.pack_bytes, spec.text_encoder, spec.prompt]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _check_components(spec: RenderPlan, fleet: Fleet) -> None:
    """Refuse a render whose pack lacks a component it needs on every worker holding it, with the
    one line that names the missing file and how to get it (or why the worker cannot serve it).
    Workers that do not describe their pack's components pass (the scheduler still matches tasks)."""
    pack = spec.pack
    held = fleet.components(pack)
    if held is None:
        return
    recipe = recipe_for(spec)
    for component in render_components(spec.as_dict(), recipe.dits, recipe.video):  # an engine rule: plain data
        if component not in held:
            raise SpecError(fleet.problem(pack, component) or missing_line(component, pack))


def plan_render(spec: RenderPlan | RenderSpec, render_id: str) -> list[dict]:
    """The render's stage graph, in a topological order: the prompt's text task (enhanced, relayed, keyed on
    the LoRAs), then what the render's recipe builds from it (plan/build.py), each task costed; of a
    validated RenderPlan (a RenderSpec alone plans as asked, unresolved)."""
    if isinstance(spec, RenderSpec):
        spec = RenderPlan(spec)
    rid = render_id
    text_id = f"{rid}.text"
    ctx = {k: ref(text_id, k) for k in ("video_context", "audio_context", "context_mask")}
    enhancer, text_inputs, enhanced_key = plan_enhance(rid, spec, text_params(spec))  # --enhance-prompt
    text = task(rid, "text", "text_encode", {"pack": spec.pack, "prompt": spec.prompt, **text_params(spec),
                                             "text_key": enhanced_key or text_key(spec),
                "expect": {k: expect("float32") for k in ctx}}, text_inputs)
    plain = text, ctx  # a chunked render's windows each relay their own segments (plan/chunks.py)
    text, ctx = with_relay(text, ctx, spec)  # --segment: the table beside the contexts (plan/relay.py)
    text = lora_text(text, spec)  # the prompt's cache key on the user LoRAs too (plan/loras.py)
    if spec.frames is None:  # an LTX-2.5 render's length is picked first (plan_length)
        costs.annotate(enhancer, spec)
        return [*enhancer, *plan_length_phase(rid, spec, text)]
    tasks = recipe_for(spec).build(spec, Prompt(rid, tuple(enhancer), text, ctx, plain, text_key))
    costs.annotate(tasks, spec)
    return tasks


def stage_latent_outputs() -> dict[str, tuple[str, str]]:
    """The latents `--save-latents` writes, by file stem → (task name suffix, output name)."""
    return {"stage1_video": ("stage1", "video_latent"), "stage1_audio": ("stage1", "audio_latent"),
            "upsampled": ("upsample", "latent"), "stage2_video": ("stage2", "video_latent")}
