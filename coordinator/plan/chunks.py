"""Chunked renders (`--chunked`): a clip longer than one window as a chain of windows. Pure.

Each window is the recipe's graph at the window's length, its tasks named `w{k}.…` (`w0.stage1`,
`w1.decode.t3`); the windows' layout is `ltx_engine.rules.chunks`. Distilled: extend's pinned stages; a guided
recipe (one-stage, two-stage, HQ): the stage blocks the unchunked render runs (`plan/stages.py`), its guided
stage with the carry pinned in its prep, then its dev stage 2, the windows' uncond passes reading one negative
text task; every DiT task with the user LoRAs as the block makes it.
Keyframes (`--image`) are encoded once and each conditions the first window that has its frame, at its frame
there (`ChunkLayout.place`). Window k + 1 is
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
IC-LoRA control / Dub-It: each window's stages take the control clip's / reference's slice for its own frames
(A2V's slice rule, `ChunkLayout.source_frames`), encoded at the window's length (`w{k}.control`, `w{k}.dub_s1`…;
Dub-It's track from the window's start), as `plan/control.py`'s `reference`; the carry pinned beside it.
"""

from __future__ import annotations

from coordinator.plan import sparse
from coordinator.plan.clip import audio_pin_task, pinned_stage1, pinned_stage2
from coordinator.plan.control import reference
from coordinator.plan.decode import DECODE, decode_tile_plan, plan_decode, tile_task_name
from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import (
    COORDINATOR,
    SpecError,
    StageGeometry,
    expect,
    latent_grid,
    mark_lead,
    ref,
    task,
)
from coordinator.plan.guidance import check_recipe
from coordinator.plan.guided_render import contexts_of
from coordinator.plan.images import plan_image_encodes
from coordinator.plan.loras import lora_params, lora_text
from coordinator.plan.media import (
    a2v_negative,
    audio_encode_task,
    encode_tile_sizes,
    frozen_track,
    video_encode_tasks,
)
from coordinator.plan.relay import window_texts
from coordinator.plan.resolved import RenderPlan
from coordinator.plan.stage2 import check_tiling
from coordinator.plan.stages import Guided, RecipeStages, stage1_block
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
NO_COND: dict = {"images": [], "inputs": {}}
ImageConds = tuple[list[dict], dict]  # a window's placed images, the encodes' inputs by stage size ("s1", "s2")


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


def _latent_context(rid: str, spec: RenderPlan, lay: ChunkLayout, window: Window, half: bool,
                    source: str) -> tuple[list[dict], dict]:
    """`--chunk-carry latent`: the window before's last carry latents of a stage (`source`: stage 1's at half
    size, stage 2's at full; a one-stage recipe's stage 1 is at full size), and the stage's replace condition
    on them (latent 0)."""
    name = f"w{window.index}.carry_s{1 if half else 2}"
    params = {"latent_frames": lay.carry_latents, "expect": {"latent": expect("float32", 1, -1, lay.carry_latents,
                                                                                -1, -1)}}
    src = {"latent": ref(f"{rid}.w{window.index - 1}.{source}", "video_latent")}
    cut = task(rid, name, "chunk_latent_carry", params, src, capability=COORDINATOR)
    image = {"input": "context", "frame": 0, "strength": 1.0, "binding": "replace"}
    return [cut], {"images": [image], "inputs": {"context": ref(cut["id"], "latent")}}


def _contexts(rid: str, spec: RenderPlan, lay: ChunkLayout, window: Window, two_stage: bool) -> tuple[list[dict],
                                                                                                    dict, dict]:
    """A later window's carried contexts: their tasks, stage 1's condition (none for a one-stage recipe, whose
    only stage is at full size) and the full-size stage's."""
    if latent_carry(spec):
        full = _latent_context(rid, spec, lay, window, False, "stage2" if two_stage else "stage1")
        half = _latent_context(rid, spec, lay, window, True, "stage1") if two_stage else ([], NO_COND)
    else:
        full = _context(rid, spec, lay, window, False)
        half = _context(rid, spec, lay, window, True) if two_stage else ([], NO_COND)
    return [*half[0], *full[0]], half[1], full[1]


def _with(cond: dict, images: ImageConds, stage: str) -> dict:
    """A stage's condition with the keyframes that fall in its window (their frames window-local)."""
    placed, inputs = images
    return {"images": [*cond["images"], *placed],
            "inputs": {**cond["inputs"], **{im["input"]: inputs[stage][im["input"]] for im in placed}}}


def _window(rid: str, spec: RenderPlan, ctx: dict, lay: ChunkLayout, window: Window,
            images: ImageConds, recipe: RecipeStages, negative: dict | None) -> list[dict]:
    """One window's stages and decode; after the first, its contexts and audio pin from the window before;
    the keyframes that fall in it (`images`) beside them."""
    wid, view = f"{rid}.w{window.index}", _seeded(spec, window)
    two_stage = recipe.two_stage
    tasks: list[dict] = []
    cond1 = cond2 = NO_COND
    pin = None
    if window.index > 0:
        before = lay.windows[window.index - 1]
        encodes, cond1, cond2 = _contexts(rid, spec, lay, window, two_stage)
        latent = ref(f"{rid}.w{before.index}.stage1", "audio_latent")
        tasks += encodes
        if spec.audio and not spec.audio_input:  # A2V: the window's own slice of the track, frozen
            tasks.append(audio_pin_task(wid, latent, lay.carry_audio_slice(before)))
            pin = (ref(f"{wid}.audio_pin", "latent"), 0)
    track = frozen_track(wid, view, spec.audio_input.start + lay.track_window(window)[0]) if spec.audio_input else None
    audio = None if track is None else ref(track["id"], "latent")  # A2V: the window's slice, frozen
    cond2 = _with(cond2, images, "s2")  # a one-stage recipe encodes its keyframes at its one size alone
    cond1 = _with(cond1, images, "s1") if two_stage else cond1
    if negative is None:
        clip = reference(wid, view, lay.source_frames(window)[0])  # IC-LoRA / Dub-It: the window's slice
        tasks += [*([] if track is None else [track]), *([] if clip is None else clip.tasks)]
        tasks.append(pinned_stage1(wid, view, window.frames, ctx, cond1, pin, sparse.stage1_params(spec), audio,
                                   clip))
        tasks += pinned_stage2(wid, view, window.frames, ctx, cond2, sparse.stage2_params(spec), audio,
                               reference=clip)
    else:
        tasks += _guided_stages(wid, spec, view, window, ctx, (cond1, cond2), pin, recipe, negative, track)
    final = "stage2" if two_stage else "stage1"
    tasks += plan_decode(wid, view, ref(f"{wid}.{final}", "video_latent"))
    if window.index < len(lay.windows) - 1 and not latent_carry(spec):
        tasks.append(_carry(rid, spec, lay, window))
    return tasks


def _guided_stages(wid: str, spec: RenderPlan, view: RenderPlan, window: Window, ctx: dict,
                   conds: tuple[dict, dict], pin: tuple[dict, int] | None, recipe: RecipeStages,
                   negative: dict, track: dict | None) -> list[dict]:
    """A guided recipe's window from the stage blocks the unchunked render runs (`plan/stages.py`): its
    guided stage with the window's replace conditions and audio pin (A2V: its frozen `track`) in its prep,
    at half size then the upsample and the dev stage 2 (two-stage, HQ), or at full size alone (one-stage);
    every DiT task with the user LoRAs as it is made."""
    rec = check_recipe(view, recipe.guidance)  # the window's length: HQ's schedule reads its stage-1 latent
    guided = Guided(rec, ctx, a2v_negative(spec, contexts_of(negative["id"]), ctx))
    cond = conds[0] if recipe.two_stage else conds[1]
    inputs, params = dict(cond["inputs"]), {"images": cond["images"]}
    if pin is not None:
        inputs["audio_pin"], params["audio_pin_start"] = pin
    geo = StageGeometry(view.pack, view.seed, window.frames, view.frame_rate, view.height, view.width)
    loras = lora_params(spec)
    tasks = stage1_block(wid, geo.half() if recipe.two_stage else geo, ctx, inputs, params, {}, {}, loras, guided,
                         track)
    if not recipe.two_stage:
        return tasks
    audio = None if track is None else ref(track["id"], "latent")
    return tasks + pinned_stage2(wid, view, window.frames, ctx, conds[1], sparse.stage2_params(spec), audio, rec,
                                 recipe.distilled_stage2)


def _images(rid: str, spec: RenderPlan, lay: ChunkLayout, two_stage: bool) -> tuple[list[dict], list[ImageConds]]:
    """The keyframes' encodes (once per stage size for the whole clip; a one-stage recipe's at full size
    alone) and, per window, the images that fall in it at their window-local frames (`ChunkLayout.place`)."""
    encodes, inputs1, inputs2, params = plan_image_encodes(rid, spec, two_stage)
    placed: list[list[dict]] = [[] for _ in lay.windows]
    for image in params.get("images", []):
        k, frame = lay.place(image["frame"])
        placed[k].append({**image, "frame": frame})
    inputs = {"s1": inputs1, "s2": inputs2}
    return encodes, [(p, inputs) for p in placed]


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


def lead_chain(rid: str, spec: RenderPlan, tasks: list[dict]) -> list[dict]:
    """The chain of windows marked to lease first (`graph.mark_lead`): each later window's stage 1 and what
    it waits on (the decoded carry: the window before's stages, tiles and decode; the latent carry: its
    stage 1 alone), so the next window starts as soon as it can while the tiles off the chain fill the
    other Macs. Unchunked: the tasks as they are."""
    if not chunked(spec):
        return tasks
    return mark_lead(tasks, {f"{rid}.w{w.index}.stage1" for w in chunk_layout(spec).windows[1:]})


def plan_chunks(rid: str, spec: RenderPlan, text: dict, ctx: dict, recipe: RecipeStages,
                negative: dict | None = None) -> list[dict]:
    """The windows' tasks in order (each window's text task, when it is the first to read it, and its carry
    before the next window), then the joined audio. `text`, `ctx`: the plain prompt's task and contexts;
    with `--segment` each window relays the segments it overlaps, clipped to it, on its own clock.
    `recipe`: the render's recipe (its stages and guidance); `negative`: a guided recipe's negative-prompt
    text task (the windows' uncond passes read it)."""
    lay = chunk_layout(spec)
    clocks = [(f"{rid}.w{w.index}", (w.start / lay.fps, w.stop / lay.fps)) for w in lay.windows]
    encodes, images = _images(rid, spec, lay, recipe.two_stage)
    tasks: list[dict] = []
    texts: set[str] = set()
    for window, (text_task, window_ctx), placed in zip(lay.windows, window_texts(text, ctx, spec, clocks), images,
                                                       strict=True):
        if text_task["id"] not in texts:
            texts.add(text_task["id"])
            tasks.append(lora_text(text_task, spec))  # keyed on the user LoRAs after its window's relay
        if window.index == 0:
            tasks += [*([] if negative is None else [negative]), *encodes]
        tasks += _window(rid, spec, window_ctx, lay, window, placed, recipe, negative)
    return tasks + (_audio(rid, spec, lay) if spec.audio else [])
