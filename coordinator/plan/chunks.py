"""Chunked renders (`--chunked`): a clip longer than one window as a chain of windows. Pure.

Each window is the distilled two-stage graph at the window's length, its tasks named `w{k}.…`
(`w0.stage1`, `w1.decode.t3`); the windows' layout is `ltx_engine.rules.chunks`. Window k + 1 is
conditioned as the extend recipe conditions its window (`plan/clip.py`'s pinned stages), on window k's
output instead of an uploaded clip: `w{k}.carry` (coordinator) takes window k's last carry frames from
its decode as 8-bit RGB, which the tiled encode (`video_encode`, reading frames instead of a file)
turns into the pinned context at half and full size; `w{k+1}.audio_pin` slices window k's stage-1 audio
latents. After the last window, `audio_join` joins the windows' audio latents and one `audio` decode
gives the whole track; the assembler crossfades the decoded windows (`assemble/chunk_frames.py`).
With `--audio` (A2V) each window is generated to the track's slice for its own frames, encoded and frozen
as A2V freezes it (`plan/media.py`'s `frozen_track`) instead of the carried pin, and `audio` encodes the
source track's window of the whole clip (what the output muxes, as A2V's does).
With `--segment`, a window's stages read a text task of its own segments (`plan/relay.py`'s `window_texts`).
"""

from __future__ import annotations

from coordinator.plan import sparse
from coordinator.plan.clip import audio_pin_task, pinned_stage1, pinned_stage2
from coordinator.plan.decode import DECODE, decode_tile_plan, plan_decode, tile_task_name
from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import COORDINATOR, SpecError, expect, latent_grid, ref, task
from coordinator.plan.loras import lora_text
from coordinator.plan.media import audio_encode_task, encode_tile_sizes, frozen_track, video_encode_tasks
from coordinator.plan.relay import window_texts
from coordinator.plan.resolved import RenderPlan
from coordinator.plan.stage2 import check_tiling
from ltx_engine.rules.chunks import (
    BLEND_FRAMES,
    CARRIES,
    CARRY_FRAMES,
    PIXEL_FRAMES,
    ChunkError,
    ChunkLayout,
    Window,
)

MAX_SEED = 2**63 - 1
ASKED = ("chunk_pixel_frames", "chunk_carry_frames", "chunk_blend_frames", "chunk_carry")


def chunked(spec: RenderPlan) -> bool:
    return bool(spec.chunked)


def chunk_layout(spec: RenderPlan) -> ChunkLayout:
    """The render's windows (the spec's numbers, else upstream's; the blend's default is ours)."""
    return ChunkLayout(spec.frames, spec.chunk_pixel_frames or PIXEL_FRAMES, spec.chunk_carry_frames or CARRY_FRAMES,
                       BLEND_FRAMES if spec.chunk_blend_frames is None else spec.chunk_blend_frames, spec.frame_rate)


def check_chunks(spec: RenderPlan) -> None:
    """The chunk flags' own rules, one line each: given only with --chunked; windows that lay out."""
    if not chunked(spec):
        given = next((name for name in ASKED if getattr(spec, name) is not None), None)
        if given is not None:
            raise SpecError(f"--{given.replace('_', '-')} needs --chunked")
        return
    if spec.spec.frames is None:  # not a length the duration head picks: one window's at most
        raise SpecError("--chunked needs -f/--frames: the whole clip's length, above one window")
    if spec.chunk_carry not in (None, *CARRIES):
        raise SpecError(f"--chunk-carry {spec.chunk_carry!r}: decoded (upstream's) or latent (ours)")
    try:
        chunk_layout(spec)
    except ChunkError as exc:
        raise SpecError(str(exc)) from None


def held_frame_bytes(spec: RenderPlan) -> int:
    """What a chunked render's windows leave in the coordinator's data folder until the clip is joined:
    each window's decoded frames (float32 RGB, the blobs the assembler crossfades), the mp4 aside."""
    return sum(w.frames for w in chunk_layout(spec).windows) * spec.height * spec.width * 3 * 4


def latent_carry(spec: RenderPlan) -> bool:
    """`--chunk-carry latent`: the stage latents carried instead of the decoded frames."""
    return spec.chunk_carry == "latent"


def window_view(spec: RenderPlan, window: Window | None = None) -> RenderPlan:
    """The render as one window sees it (its frames; the first, longest, window by default): what the
    checks of one generation's length, tiles and memory read. Unchunked: the render itself."""
    if not chunked(spec):
        return spec
    return spec.resolve(frames=(window or chunk_layout(spec).windows[0]).frames)


def window_views(spec: RenderPlan) -> list[RenderPlan]:
    """One view per distinct window length (the last window is shorter), for checks that depend on it."""
    if not chunked(spec):
        return [spec]
    return [spec.resolve(frames=n) for n in sorted({w.frames for w in chunk_layout(spec).windows})]


def check_window_tiling(spec: RenderPlan, fleet: Fleet) -> str | None:
    """Stage 2's tiles (`stage2.check_tiling`) resolved on the first window and held to every window length
    (the last window is shorter); unchunked, the render's."""
    tiles = check_tiling(window_view(spec), fleet)
    for view in window_views(spec)[:-1]:
        check_tiling(view.resolve(stage2_tiles=tiles) if tiles else view, fleet)
    return tiles


def _seeded(spec: RenderPlan, window: Window) -> RenderPlan:
    """A window's view with its own seed (seed + k): each window draws its own noise."""
    return window_view(spec, window).with_asked(seed=(spec.seed + window.index) % (MAX_SEED + 1))


def _carry(rid: str, spec: RenderPlan, lay: ChunkLayout, window: Window) -> dict:
    """`w{k}.carry`: window k's last carry frames from its decode (untiled: its frames; tiled: its tiles)."""
    wid = f"{rid}.w{window.index}"
    view = window_view(spec, window)
    tiles = decode_tile_plan(view)
    params: dict = {"frames": window.frames, "carry": lay.carry,
                    "expect": {"frames": expect("uint8", lay.carry, spec.height, spec.width, 3)}}
    if tiles is None:
        inputs = {"frames": ref(f"{wid}.{DECODE}", "frames")}
    else:
        params |= {"grid": list(latent_grid(view)), "sizes": view.decode_tiles, "tiles": len(tiles)}
        inputs = {f"t{t.index}": ref(f"{wid}.{tile_task_name(t.index)}", "pixels") for t in tiles}
    return task(rid, f"w{window.index}.carry", "chunk_carry", params, inputs, capability=COORDINATOR)


def _context(rid: str, spec: RenderPlan, lay: ChunkLayout, window: Window, half: bool) -> tuple[list[dict], dict]:
    """The carried frames encoded at a stage's size, and the stage's replace condition on them (latent 0)."""
    h, w = (spec.height // 2, spec.width // 2) if half else (spec.height, spec.width)
    name = f"w{window.index}.context_s{1 if half else 2}"
    frames = ref(f"{rid}.w{window.index - 1}.carry", "frames")
    tasks, latent = video_encode_tasks(rid, name, spec.pack, "", (lay.carry, h, w), encode_tile_sizes(spec),
                                       frames_ref=frames)
    image = {"input": "context", "frame": 0, "strength": 1.0, "binding": "replace"}
    return tasks, {"images": [image], "inputs": {"context": latent}}


def _latent_context(rid: str, spec: RenderPlan, lay: ChunkLayout, window: Window,
                    half: bool) -> tuple[list[dict], dict]:
    """`--chunk-carry latent`: the window before's last carry latents of a stage (stage 1's at half size,
    stage 2's at full), and the stage's replace condition on them (latent 0)."""
    stage = "stage1" if half else "stage2"
    name = f"w{window.index}.carry_s{1 if half else 2}"
    params = {"latent_frames": lay.carry_latents, "expect": {"latent": expect("float32", 1, -1, lay.carry_latents,
                                                                                -1, -1)}}
    source = {"latent": ref(f"{rid}.w{window.index - 1}.{stage}", "video_latent")}
    cut = task(rid, name, "chunk_latent_carry", params, source, capability=COORDINATOR)
    image = {"input": "context", "frame": 0, "strength": 1.0, "binding": "replace"}
    return [cut], {"images": [image], "inputs": {"context": ref(cut["id"], "latent")}}


def _window(rid: str, spec: RenderPlan, ctx: dict, lay: ChunkLayout, window: Window) -> list[dict]:
    """One window's stages and decode; after the first, its contexts and audio pin from the window before."""
    wid, view = f"{rid}.w{window.index}", _seeded(spec, window)
    tasks: list[dict] = []
    cond1 = cond2 = {"images": [], "inputs": {}}
    pin = None
    if window.index > 0:
        before = lay.windows[window.index - 1]
        contexts = _latent_context if latent_carry(spec) else _context
        enc1, cond1 = contexts(rid, spec, lay, window, True)
        enc2, cond2 = contexts(rid, spec, lay, window, False)
        latent = ref(f"{rid}.w{before.index}.stage1", "audio_latent")
        tasks += [*enc1, *enc2]
        if spec.audio and not spec.audio_input:  # A2V: the window's own slice of the track, frozen
            tasks.append(audio_pin_task(wid, latent, lay.carry_audio_slice(before)))
            pin = (ref(f"{wid}.audio_pin", "latent"), 0)
    track = frozen_track(wid, view, spec.audio_input.start + lay.track_window(window)[0]) if spec.audio_input else None
    audio = None
    if track is not None:  # A2V: the window's slice of the track, frozen
        tasks.append(track)
        audio = ref(track["id"], "latent")
    tasks.append(pinned_stage1(wid, view, window.frames, ctx, cond1, pin, sparse.stage1_params(spec), audio))
    tasks += pinned_stage2(wid, view, window.frames, ctx, cond2, sparse.stage2_params(spec), audio)
    tasks += plan_decode(wid, view, ref(f"{wid}.stage2", "video_latent"))
    if window.index < len(lay.windows) - 1 and not latent_carry(spec):
        tasks.append(_carry(rid, spec, lay, window))
    return tasks


def _audio(rid: str, spec: RenderPlan, lay: ChunkLayout) -> list[dict]:
    """The windows' audio latents joined (`audio_join`), decoded once (`audio`, what the output muxes);
    A2V: the source track's window of the whole clip instead (its latent unread)."""
    if spec.audio_input:
        return [audio_encode_task(rid, spec)]
    latents = {f"w{w.index}": ref(f"{rid}.w{w.index}.stage1", "audio_latent") for w in lay.windows}
    params = {"total": lay.total, "window": lay.window, "carry": lay.carry, "blend": lay.blend, "fps": lay.fps,
              "windows": len(lay.windows), "expect": {"latent": expect("float32", 1, -1, -1, -1)}}
    join = task(rid, "audio_join", "chunk_audio_join", params, latents, capability=COORDINATOR)
    decode = task(rid, "audio", "decode_audio", {
        "pack": spec.pack, "product": "audio",
        "expect": {"waveform": expect("float32", -1, -1), "sample_rate": expect("int32", 1)}},
        {"latent": ref(join["id"], "latent")})
    return [join, decode]


def plan_chunks(rid: str, spec: RenderPlan, text: dict, ctx: dict) -> list[dict]:
    """The windows' tasks in order (each window's text task, when it is the first to read it, and its carry
    before the next window), then the joined audio. `text`, `ctx`: the plain prompt's task and contexts;
    with `--segment` each window relays the segments it overlaps, clipped to it, on its own clock."""
    lay = chunk_layout(spec)
    clocks = [(f"{rid}.w{w.index}", (w.start / lay.fps, w.stop / lay.fps)) for w in lay.windows]
    tasks: list[dict] = []
    texts: set[str] = set()
    for window, (text_task, window_ctx) in zip(lay.windows, window_texts(text, ctx, spec, clocks), strict=True):
        if text_task["id"] not in texts:
            texts.add(text_task["id"])
            tasks.append(lora_text(text_task, spec))  # keyed on the user LoRAs after its window's relay
        tasks += _window(rid, spec, window_ctx, lay, window)
    return tasks + (_audio(rid, spec, lay) if spec.audio else [])
