"""The pipelines that start from a user's clip (retake/extend): their stage graphs. Pure.

Retake (`--retake VIDEO --start S --end E`, upstream 1.0.0's distilled retake): the clip's first
`frames` frames at the render's rate (picked by timestamp, `ltx_engine.rules.clip_frames`), encoded at its
size (the tiled `source_encode`), its own track encoded (`source_audio`, when the probe found one),
then ONE full-size `denoise_stage1` (DISTILLED_SIGMAS, Euler) from those latents with the window's
masks (`params["retake"]`, `ltx_engine.rules.retake`): every token outside the window keeps the source's
latent exactly. Then the decode, and the audio decode of the stage's audio latent.

Extend (`--extend VIDEO --extend-frames N [--direction after|before]`, the distilled extend of
`media_pipelines.extend_window`): the clip's boundary 25 frames encoded at half and full size
(`context_s1`, `context_s2`), pinned (replace) in stage 1 and stage 2 of the distilled two-stage graph
on a window of 25 + 8 N frames; the boundary's audio, sliced from the source track's latent on the
coordinator (`extend_audio_pin`), pinned in stage 1; then `extend_join` (coordinator) joins the window's
new latents to the source's (`source_encode`, `source_audio`) and the whole clip decodes once.

The dev recipes (`retake-dev`, `extend-dev`) hand a `Guided` stage: the retake's one stage becomes the
one-stage recipe's guided stage, extend's stage 1 the two-stage recipe's guided stage and its stage 2 the
dev stage 2; the window's masks, context and audio pin ride on the guided stage's `stage_prepare`.
"""

from __future__ import annotations

from coordinator.plan import samplers
from coordinator.plan.control import Reference
from coordinator.plan.decode import plan_decode
from coordinator.plan.graph import (
    COORDINATOR,
    SPATIAL_FACTOR,
    StageGeometry,
    audio_latent_frames,
    expect,
    latent_frames,
    ref,
    task,
)
from coordinator.plan.guidance import GuidedStage
from coordinator.plan.guided_render import plan_guided_stage1
from coordinator.plan.loras import lora_params
from coordinator.plan.media import audio_encode_task, encode_tile_sizes, plan_video_encode, video_encode_tasks
from coordinator.plan.resolved import RenderPlan
from coordinator.plan.sp_degree import TABLE_PARAM, stage1_params
from coordinator.plan.stage2 import stage2_sigmas
from coordinator.plan.stages import Guided, stage1_block, stage2_block, upsample_block
from ltx_engine.rules.extend import CONTEXT_PIXEL_FRAMES, ExtendLayout
from ltx_engine.rules.generation import stage1_sampler
from ltx_engine.rules.sampling import DISTILLED_SIGMAS, EULER

SOURCE_AUDIO = "source_audio"


def clip_pipeline(spec: RenderPlan) -> str | None:
    return "retake" if spec.retake else "extend" if spec.extend else None


def layout(spec: RenderPlan) -> ExtendLayout:
    ext = spec.extend
    return ExtendLayout(spec.frames, spec.frame_rate, ext.frames, ext.direction)


def _source_audio(rid: str, spec: RenderPlan) -> dict | None:
    """The clip's own track's encode (the render's `frames` from its start), unless the probe found none."""
    if spec.source_audio is False:
        return None
    return audio_encode_task(rid, spec, SOURCE_AUDIO, blob=spec.source_video.blob, start=0.0)


def _decode_audio(rid: str, spec: RenderPlan, latent: dict) -> list[dict]:
    if not spec.audio:
        return []
    return [
        task(
            rid,
            "audio",
            "decode_audio",
            {
                "pack": spec.pack,
                "product": "audio",
                "expect": {"waveform": expect("float32", -1, -1), "sample_rate": expect("int32", 1)},
            },
            {"latent": latent},
        )
    ]


def _stage_params(spec: RenderPlan, frames: int, height: int, width: int) -> dict:
    return {
        "pack": spec.pack,
        "seed": spec.seed,
        "frames": frames,
        "fps": spec.frame_rate,
        "height": height,
        "width": width,
        "audio_frames": audio_latent_frames(frames, spec.frame_rate),
    }


def _latent_expect(frames: int, height: int, width: int, fps: float) -> dict:
    return {
        "video_latent": expect(
            "float32", 1, -1, latent_frames(frames), height // SPATIAL_FACTOR, width // SPATIAL_FACTOR
        ),
        "audio_latent": expect("float32", 1, -1, audio_latent_frames(frames, fps), -1),
    }


def _gang(spec: RenderPlan, frames: int, height: int, width: int) -> dict:
    """A distilled stage 1's gang request and degree table (`--stage1-parallel`) for its video tokens: the
    window's masks and pins are per-token states, split with the tokens; a pinned audio is whole on every rank."""
    tokens = latent_frames(frames) * (height // SPATIAL_FACTOR) * (width // SPATIAL_FACTOR)
    return stage1_params(spec, tokens, len(DISTILLED_SIGMAS) - 1)


def plan_retake(rid: str, spec: RenderPlan, ctx: dict, guided: Guided | None = None) -> list[dict]:
    """The source's encodes, then the one full-size stage: distilled, or (`guided`: the dev recipe's) the
    guided stage, whose prepare pins the same tokens outside the window."""
    encodes, latent = plan_video_encode(rid, spec)
    tasks, inputs = list(encodes), {"latent": latent}
    audio = _source_audio(rid, spec)
    if audio is not None:
        tasks.append(audio)
        inputs["audio_latent"] = ref(audio["id"], "latent")
    window = spec.retake
    frames, height, width = spec.frames, spec.height, spec.width
    if guided is not None:
        geo = StageGeometry(spec.pack, spec.seed, frames, spec.frame_rate, height, width)
        tasks += plan_guided_stage1(rid, geo, guided.stage, guided.ctx, guided.negative, inputs,
                                    {"retake": [window.start, window.end, window.regen_audio]}, lora_params(spec))
        tasks += plan_decode(rid, spec, ref(f"{rid}.stage1", "video_latent"))
        return tasks + _decode_audio(rid, spec, ref(f"{rid}.stage1", "audio_latent"))
    params = {
        **_stage_params(spec, frames, height, width),
        "sigmas": list(DISTILLED_SIGMAS),
        "sampler": EULER,
        "retake": [window.start, window.end, window.regen_audio],
        **lora_params(spec),
        **_gang(spec, frames, height, width),
        "expect": _latent_expect(frames, height, width, spec.frame_rate),
    }
    tasks.append(task(rid, "stage1", "denoise_stage1", params, {**ctx, **inputs}))
    tasks += plan_decode(rid, spec, ref(f"{rid}.stage1", "video_latent"))
    return tasks + _decode_audio(rid, spec, ref(f"{rid}.stage1", "audio_latent"))


def _context(rid: str, spec: RenderPlan, lay: ExtendLayout, half: bool) -> tuple[list[dict], dict]:
    """The clip's boundary 25 frames at a stage's size, and the stage's replace condition on them."""
    h, w = (spec.height // 2, spec.width // 2) if half else (spec.height, spec.width)
    name = "context_s1" if half else "context_s2"
    tasks, latent = video_encode_tasks(
        rid,
        name,
        spec.pack,
        spec.source_video.blob,
        (CONTEXT_PIXEL_FRAMES, h, w),
        encode_tile_sizes(spec),
        lay.context_pixels[0],
        fps=spec.frame_rate,
    )
    image = {"input": "context", "frame": lay.context_frame, "strength": 1.0, "binding": "replace"}
    return tasks, {"images": [image], "inputs": {"context": latent}}


def plan_extend(rid: str, spec: RenderPlan, ctx: dict, guided: Guided | None = None) -> list[dict]:
    """The source's encode, the window's two stages (`guided`: the dev recipe's guided stage 1 and its dev
    stage 2, the same context and audio pinned), the join and the one decode."""
    lay = layout(spec)
    tasks, source = plan_video_encode(rid, spec)
    audio = _source_audio(rid, spec) if spec.audio else None
    tasks = [*tasks, *_extend_stage1(rid, spec, lay, ctx, audio, guided)]
    return tasks + _extend_stage2(rid, spec, lay, ctx, guided) + _join(rid, spec, lay, source, audio)


def _extend_stage1(rid: str, spec: RenderPlan, lay: ExtendLayout, ctx: dict, audio: dict | None,
                   guided: Guided | None) -> list[dict]:
    """The half-size context's encode, the source track's pinned boundary, stage 1 on the window (a dev
    recipe's: its guided stage, the conditions and the pin in its prepare)."""
    tasks, cond = _context(rid, spec, lay, True)
    pin = None
    if audio is not None:
        cut = lay.source_audio_slice(audio_latent_frames(spec.frames, spec.frame_rate))
        tasks += [audio, audio_pin_task(rid, ref(audio["id"], "latent"), cut)]
        pin = (ref(f"{rid}.audio_pin", "latent"), lay.audio_pin_start)
    if guided is None:
        gang = _gang(spec, lay.window_frames, spec.height // 2, spec.width // 2)
        return [*tasks, pinned_stage1(rid, spec, lay.window_frames, ctx, cond, pin, gang)]
    inputs, params = dict(cond["inputs"]), {"images": cond["images"]}
    if pin is not None:
        inputs["audio_pin"], params["audio_pin_start"] = pin
    geo = StageGeometry(spec.pack, spec.seed, lay.window_frames, spec.frame_rate, spec.height, spec.width)
    return tasks + stage1_block(rid, geo.half(), ctx, inputs, params, {}, {}, lora_params(spec), guided)


def audio_pin_task(rid: str, latent: dict, cut: slice) -> dict:
    """The coordinator's slice of a track's latents a window pins (`audio_pin`)."""
    pin = {"start": cut.start, "stop": cut.stop, "expect": {"latent": expect("float32", 1, -1, -1, -1)}}
    return task(rid, "audio_pin", "extend_audio_pin", pin, {"latent": latent}, capability=COORDINATOR)


def pinned_stage1(rid: str, spec: RenderPlan, frames: int, ctx: dict, cond: dict,
                  pin: tuple[dict, int] | None = None, extra: dict | None = None, audio: dict | None = None,
                  reference: Reference | None = None) -> dict:
    """Stage 1 at half size on a window of `frames` with `cond`'s replace conditions ({"images", "inputs"})
    and, given, `pin` (the audio latents' reference, the first audio token they are pinned at) or `audio`
    (A2V's frozen track's latent); `reference`: a chunked window's control / Dub-It slice (its IC-LoRA and
    stage-1 inputs; a chunked window never gangs; its encodes are the caller's)."""
    fps, height, width = spec.frame_rate, spec.height // 2, spec.width // 2
    params = {
        **_stage_params(spec, frames, height, width),
        "sigmas": list(DISTILLED_SIGMAS),
        "images": cond["images"],
        **(extra or {}),
        **(lora_params(spec) if reference is None else {**reference.dit(lora_params(spec)), TABLE_PARAM: [1]}),
        "expect": _latent_expect(frames, height, width, fps),
    }
    if spec.generation:
        params["sampler"] = stage1_sampler(spec.generation, False)
    inputs = {**ctx, **cond["inputs"], **({} if reference is None else reference.stage1)}
    if pin is not None:
        params["audio_pin_start"] = pin[1]
        inputs["audio_pin"] = pin[0]
    if audio is not None:
        inputs["audio_latent"] = audio
    return task(rid, "stage1", "denoise_stage1", params, inputs)


def _extend_stage2(rid: str, spec: RenderPlan, lay: ExtendLayout, ctx: dict, guided: Guided | None) -> list[dict]:
    """The full-size context's encode, the upsample and stage 2 on the window (a dev recipe's on dev + the
    distilled LoRA)."""
    encodes, cond = _context(rid, spec, lay, False)
    dev = {} if guided is None else {"guided": guided.stage, "distilled_stage2": False}
    stages = pinned_stage2(rid, spec, lay.window_frames, ctx, cond, **dev)
    return [stages[0], *encodes, *stages[1:]]


def pinned_stage2(rid: str, spec: RenderPlan, frames: int, ctx: dict, cond: dict,
                  extra: dict | None = None, audio: dict | None = None, guided: GuidedStage | None = None,
                  distilled_stage2: bool = True, reference: Reference | None = None) -> list[dict]:
    """The upsample and stage 2 (untiled, or TDP tiles) on a window of `frames` with `cond`'s conditions,
    made by the stage-2 block (`plan/stages.py`); `audio`: the latent it reads (A2V's frozen track), else
    stage 1's; `guided`: a guided recipe's stage (its stage 2 on dev + the distilled LoRA,
    HQ's as res_2s guide steps); `distilled_stage2`: the recipe's fact (a guided two-stage's stage 2 keeps
    Euler, `plan/samplers.py`); `reference`: a chunked Dub-It window's slice (stage 2's reference and LoRA)."""
    geo = StageGeometry(spec.pack, spec.seed, frames, spec.frame_rate, spec.height, spec.width)
    s1 = f"{rid}.stage1"
    tasks = [upsample_block(rid, geo)]
    params = {
        "sigmas": stage2_sigmas(spec),
        "noise_stream": 1,
        "images": cond["images"],
        **(extra or {}),
        **samplers.stage2_params(spec, distilled_stage2),
    }
    inputs = {
        **cond["inputs"],
        "latent": ref(f"{rid}.upsample", "latent"),
        "audio_latent": audio or ref(s1, "audio_latent"),
    }
    window = spec if spec.stage2_tiles is None else spec.resolve(frames=frames)  # tiles cover the window
    return [*tasks, *stage2_block(rid, geo, window, params, inputs, ctx, {}, lora_params(spec), guided, reference)]


def _join(rid: str, spec: RenderPlan, lay: ExtendLayout, source: dict, audio: dict | None) -> list[dict]:
    """The window's new latents joined to the source's, then one decode of the whole clip."""
    inputs = {"source": source, "window": ref(f"{rid}.stage2", "video_latent")}
    out = _latent_expect(lay.output_frames, spec.height, spec.width, spec.frame_rate)
    if audio is not None:
        inputs |= {
            "source_audio": ref(audio["id"], "latent"),
            "window_audio": ref(f"{rid}.stage1", "audio_latent"),
        }
    else:
        out.pop("audio_latent")
    params = {
        "source_frames": lay.source_frames,
        "fps": lay.fps,
        "new_latent_frames": lay.new_latent_frames,
        "direction": lay.direction,
        "expect": out,
    }
    tasks = [task(rid, "join", "extend_join", params, inputs, capability=COORDINATOR)]
    tasks += plan_decode(rid, spec.resolve(frames=lay.output_frames), ref(f"{rid}.join", "video_latent"))
    return tasks + (_decode_audio(rid, spec, ref(f"{rid}.join", "audio_latent")) if audio is not None else [])


def plan_clip(rid: str, spec: RenderPlan, ctx: dict, guided: Guided | None = None) -> list[dict]:
    """The clip pipeline's tasks after the text task (and a dev recipe's negative prompt's: `guided`)."""
    if clip_pipeline(spec) == "retake":
        return plan_retake(rid, spec, ctx, guided)
    return plan_extend(rid, spec, ctx, guided)
