"""A user's media in the stage graph. Pure.

A2V (`--audio FILE [--audio-start S]`, distilled 8+3, or upstream's `a2vid_two_stage` with
`--pipeline two-stage` (and the same guided stage at full size with `one-stage`, or HQ's res_2s stages
with `two-stage-hq`, whose masked steps hold the track as Euler's do), or DFR on LTX-2.5 as
the MLX port's `a2v --dfr`): one
`audio_encode` task, named `audio` because its outputs are what the output muxes (the SOURCE waveform
of the clip's window, at the file's rate, as upstream returns it instead of the VAE's), encodes the
track's window into the clip's audio latent; stage 1, the upsample's stage 2 (untiled or every tile)
take that latent frozen (`ltx_engine.denoise._audio_state`: mask 0, sigma 0); the `decode_audio` task
is dropped. With `--image` too (upstream's A2V takes images the same way). The guided stage 1 reads
the latent in its `stage1.prep` (every pass then carries the frozen audio state), with upstream's
audio guider (`MultiModalGuiderParams()`: no audio guidance, so the passes are the video scales') and
the uncond pass's audio stream on the prompt's context (upstream's audio guider has no negative
context); stage 2 keeps it frozen (no re-noise) as upstream's `a2vid_two_stage` does. Under DFR the
clip's window is encoded and its latent right-padded with zero tokens to DFR's padded canvas (the
port's rule: stages 1-2 run on the canvas, the track frozen in both and in the epilogue; the temporal
rounds run video only); the trim cuts the padding off with the canvas's and the output muxes the
clip's source window.

A source video (`source_video`): the video VAE encode tiled across workers like the decode: one
`video_encode` task per tile of `ltx_engine.rules.encode_tiling`'s plan (upstream's tiled encoding), and a
coordinator task `video_encode_blend` that blends them in tile order into the clip's latent
(`source_encode.latent`), which the pipelines that start from a clip (retake, extend, IC-LoRA control)
read. Decoding and resizing happen in the encode tasks, on workers, after the coordinator's probe.
"""

from __future__ import annotations

from coordinator.plan.dfr import canvas_frames
from coordinator.plan.graph import COORDINATOR, SpecError, audio_latent_frames, expect, ref, task
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.encode_tiling import EncodeTileSizes, crop_frames, latent_shape, plan_encode_tiles

AUDIO_TASK = "audio"  # the assembler muxes `audio.waveform` / `audio.sample_rate` (the source's, for A2V)
SOURCE_ENCODE = "source_encode"
DEFAULT_ENCODE_TILES = EncodeTileSizes()  # upstream's tiled-encode defaults: 64 frames / 24, 512 px / 64


def check_media(spec: RenderPlan) -> None:
    """A2V's own rule, its audio kept (which recipes take `--audio`, and that a frozen track takes no audio
    guidance, is the modifier table's, `plan/recipes/`); a source clip's encode tiles that upstream's tiling
    takes."""
    if spec.source_video:
        encode_tile_sizes(spec)
    audio = spec.audio_input
    if not audio:
        return
    name = audio.name or "the track"
    if not spec.audio:
        raise SpecError(f"--audio {name}: the output carries the source track; drop --no-audio")


def audio_encode_task(
    rid: str,
    spec: RenderPlan,
    name: str = AUDIO_TASK,
    blob: str | None = None,
    start: float | None = None,
    pad_frames: int | None = None,
) -> dict:
    """A track's window [start, start + frames / fps] -> the clip's audio latent, and the window itself:
    the spec's `--audio` by default; a source clip's own track (`blob`, `start`) for the pipelines that
    start from a clip, under their own `name`. `pad_frames`: the latent right-padded with zero tokens to
    that many frames (DFR's canvas, as the MLX port's `fit_audio_tokens`)."""
    audio, frames, fps = spec.audio_input, spec.frames, spec.frame_rate
    a_lat = audio_latent_frames(frames, fps)
    start = audio.start if start is None else float(start)
    params = {
        "pack": spec.pack,
        "start": start,
        "frames": frames,
        "fps": fps,
        "audio_frames": a_lat,
        **({"pad_audio_frames": pad_frames} if pad_frames and pad_frames > a_lat else {}),
        "product": "audio",
        "expect": {
            "latent": expect("float32", 1, -1, max(a_lat, pad_frames or 0), -1),
            "waveform": expect("float32", -1, -1),
            "sample_rate": expect("int32", 1),
        },
    }
    return task(rid, name, "audio_encode", params, {"audio": {"blob": blob or audio.blob}})


def a2v_negative(spec: RenderPlan, negative: dict, prompt: dict) -> dict:
    """The uncond pass's contexts: with A2V its audio stream reads the prompt's (upstream's audio
    guider has no negative context, so its uncond batch takes the positive one)."""
    if not spec.audio_input:
        return negative
    return {**negative, "audio_context": prompt["audio_context"]}


def frozen_track(rid: str, spec: RenderPlan, start: float | None = None) -> dict | None:
    """A2V's encode of the track's window (None without `--audio`): the `audio` task the output muxes, in
    the audio decode's place, whose latent the stages read frozen in place of stage 1's, never re-noised
    (at the stages' length: DFR's canvas). `start`: the track's second the clip starts at (a chunked
    window's; else `--audio-start`)."""
    if not spec.audio_input:
        return None
    pad = audio_latent_frames(canvas_frames(spec), spec.frame_rate)  # the stages' audio length
    return audio_encode_task(rid, spec, start=start, pad_frames=pad)


def encode_tile_sizes(spec: RenderPlan) -> EncodeTileSizes:
    """`encode_tiles` "F,S" (temporal and spatial tile sizes in pixels, `off` for one whole tile), else
    upstream's defaults; the overlaps are upstream's (24 frames, at most F - 8, and 64 pixels; below 16 /
    64 the plan refuses them, as upstream 1.2.0 does)."""
    text = (spec.encode_tiles or "auto").strip().lower()  # None: not asked, upstream's tiles
    if text == "auto":
        return DEFAULT_ENCODE_TILES
    if text == "off":
        return EncodeTileSizes(frames=None, spatial=None)
    try:
        frames, spatial = (int(x) for x in text.split(","))
        return EncodeTileSizes(frames=frames, frames_overlap=min(24, frames - 8), spatial=spatial)
    except ValueError as exc:
        raise SpecError(
            f"--encode-tiles {text!r}: {exc}"
            if "tile" in str(exc)
            else f"--encode-tiles {text!r} is not F,S (pixel frames, pixels), auto or off"
        ) from None


def plan_video_encode(rid: str, spec: RenderPlan) -> tuple[list[dict], dict | None]:
    """The source clip's tile encodes and their blend at the render's rate and size, from its start; the
    blended latent's reference (None: no source)."""
    source = spec.source_video
    if not source:
        return [], None
    size = (spec.frames, spec.height, spec.width)
    sizes = encode_tile_sizes(spec)
    return video_encode_tasks(
        rid, SOURCE_ENCODE, spec.pack, source.blob, size, sizes, fps=spec.frame_rate
    )


def video_encode_tasks(
    rid: str,
    name: str,
    pack: str,
    blob: str,
    size: tuple[int, int, int],
    sizes: EncodeTileSizes,
    first: int = 0,
    fps: float | None = None,
    frames_ref: dict | None = None,
) -> tuple[list[dict], dict]:
    """Frames [first, first + F) of a clip blob (F cropped to 1 + 8k; at `fps` by timestamp, else by
    index), each resized to H x W, encoded one task per tile (`{name}.t{i}`) and blended by the
    coordinator (`{name}`): the tasks and the blended latent's reference. What the pipelines that start from a clip plan (the source at a stage's
    size, extend's boundary frames) with their own name, frames and size; `frames_ref`: decoded frames
    (uint8 (F, H, W, 3), a chunked render's carry) instead of the clip blob, taken by index."""
    frames, height, width = crop_frames(size[0]), size[1], size[2]
    base = {"pack": pack, "frames": frames, "height": height, "width": width, "first": int(first)}
    if fps is not None:  # the clip's frames by timestamp at the render's rate (ltx_engine/rules/clip_frames)
        base["fps"] = float(fps)
    tasks, blend_in = [], {}
    for i, tile in enumerate(plan_encode_tiles(frames, height, width, sizes)):
        pixels = [[s.start, s.stop] for s in tile.pixels]
        lat = tuple(s.stop - s.start for s in tile.latents)
        params = {**base, "pixels": pixels, "expect": {"latent": expect("float32", 1, -1, *lat)}}
        source = {"video": {"blob": blob}} if frames_ref is None else {"frames": dict(frames_ref)}
        tasks.append(task(rid, f"{name}.t{i}", "video_encode", params, source))
        blend_in[f"t{i}"] = ref(tasks[-1]["id"], "latent")
    blend = {
        "frames": frames,
        "height": height,
        "width": width,
        "tiles": len(tasks),
        "sizes": [sizes.frames, sizes.frames_overlap, sizes.spatial, sizes.spatial_overlap],
        "expect": {"latent": expect("float32", 1, -1, *latent_shape(frames, height, width))},
    }
    tasks.append(task(rid, name, "video_encode_blend", blend, blend_in, capability=COORDINATOR))
    return tasks, ref(f"{rid}.{name}", "latent")
