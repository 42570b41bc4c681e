"""`farm render --local`: the planner's stage graph run task by task in this process.

No coordinator, no Redis: the reference that every distributed result is compared with. Task outputs
go through the same tensor codec as the farm's blobs, so both see byte-identical inputs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from coordinator.admit.lora_check import check_render_depth
from coordinator.admit.media_check import check_render_media, clip_frames
from coordinator.assemble.assembler import assemble_streaming
from coordinator.assemble.audio_file import AUDIO_FILES
from coordinator.assemble.hdr_master import HLG_FILE, hlg_path
from coordinator.plan.chunks import window_view
from coordinator.plan.decode import resolve_decode_tiles
from coordinator.plan.diffusion_decode import check_video_decoder, is_diffusion
from coordinator.plan.enhance import check_enhancer, plan_enhance
from coordinator.plan.fleet import Fleet
from coordinator.plan.graph import COORDINATOR
from coordinator.plan.hdr import check_hdr_lora, is_hdr
from coordinator.plan.length import head_params, length_line, no_head, picked
from coordinator.plan.render import normalize_spec, plan_render, text_params, validate_spec
from coordinator.plan.resolved import RenderPlan, Resolved
from coordinator.reduce.reducer import run_reduce_task
from ltx_engine.rules import text_encoders
from ltx_engine.rules.components import TEXT_ENCODER
from ltx_engine.rules.generation import LTX_25
from ltx_engine.rules.text_encoders import LM_HEAD
from protos.spec import RenderSpec
from protos.tensors import decode_tensor, encode_tensor, sha256_hex
from worker.memory import device_memory_bytes
from worker.runner import Runner


class LocalBlobs:
    """sha256 → encoded tensor bytes, in memory."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}

    def put(self, array: np.ndarray) -> str:
        data = encode_tensor(array)
        sha = sha256_hex(data)
        self._blobs[sha] = data
        return sha

    def get(self, sha: str) -> np.ndarray:
        return decode_tensor(self._blobs[sha])

    def put_file(self, sha: str, path: Path) -> None:
        """A client media file under its own sha256, read back as the uint8 bytes a worker's blob
        transfer hands a raw file input (`worker.transfer.as_array`), so both encode the same input."""
        self._blobs[sha] = encode_tensor(np.frombuffer(Path(path).read_bytes(), dtype=np.uint8))


def local_params(task: dict) -> dict:
    """A task the farm may gang (a stage 1, HDR's stage, a guidance pass: its degree table) runs its k shards in
    this process (the same split)."""
    from coordinator.plan.sp_degree import local_degree

    k = local_degree(task["params"])
    return {**task["params"], "stage1_parallel": k} if k > 1 else task["params"]


def run_plan(tasks: list[dict], runner: Runner, blobs: LocalBlobs,
             on_event: Callable[[dict], None] | None = None) -> dict[str, dict[str, str]]:
    """Run tasks in plan (topological) order; returns task id → {output name: sha}."""
    outputs: dict[str, dict[str, str]] = {}
    for task in tasks:
        inputs = {}
        for name, ref in task["inputs"].items():
            sha = ref["blob"] if "blob" in ref else outputs[ref["task"]][ref["output"]]
            inputs[name] = blobs.get(sha)

        def progress(step: int, steps: int, task_id: str = task["id"]) -> None:
            if on_event:
                on_event({"type": "task_progress", "task": task_id, "step": step, "steps": steps})

        if task["capability"] == COORDINATOR:
            result, metrics = run_reduce_task(task["kind"], task["params"], inputs), {}
        else:
            result, metrics = runner.run(task["kind"], local_params(task), inputs, progress)
        outputs[task["id"]] = {name: blobs.put(array) for name, array in result.items()}
        if on_event:
            on_event({"type": "task_done", "task": task["id"], "kind": task["kind"], **metrics})
    return outputs


def render_local(raw_spec: dict | RenderSpec, out_path: Path, runner: Runner,
                 images: Sequence[np.ndarray] | np.ndarray | None = (),
                 on_event: Callable[[dict], None] | None = None, media: Mapping[str, Path] | None = None,
                 ) -> tuple[Path, dict[str, dict[str, str]], LocalBlobs]:
    """Validate, plan and run a render in-process; writes the mp4 and its metadata JSON (out_path with .json).
    `media`: the client's media files by sha256 (`--audio`), probed as the coordinator probes them."""
    blobs = LocalBlobs()
    spec = normalize_spec(raw_spec).spec
    images = [] if images is None else [images] if isinstance(images, np.ndarray) else list(images)
    if images:  # each image (one decoded array per spec image, in order) into the local blob store, as uploaded
        spec = replace(spec, images=tuple(replace(im, blob=blobs.put(px)) for im, px in zip(spec.images, images, strict=True)))
    exr_dir = Path(str(spec.exr)).expanduser().resolve() if spec.exr else None
    if exr_dir is not None:  # the folder as this machine names it, before the spec is checked
        spec = replace(spec, exr=str(exr_dir))
    known = Resolved(generation=runner.pack_generation(spec.pack))  # this machine's pack is the whole fleet's
    known = replace(known, **clip_frames(RenderPlan(spec, known), lambda sha: (media or {}).get(sha)))
    if spec.frames is None and known.frames is None and known.generation == LTX_25 and not spec.hdr_ic_lora:
        if not runner.pack(spec.pack).has("duration_head"):
            raise no_head(spec.pack)
        known = predict_frames(RenderPlan(spec, known), runner)
    plan = validate_spec(spec, Fleet(), known)  # no workers registered: this machine's pack is checked here
    check_render_depth(plan, getattr(runner.pack(spec.pack), "root", None))  # STG blocks the DiT has
    plan = plan.resolve(**check_render_media(plan, lambda sha: (media or {}).get(sha)))  # the coordinator's probe
    if is_diffusion(plan):  # this machine's pack is the fleet's (read only when it is asked for)
        check_video_decoder(plan, runner.pack(spec.pack).has("vae_decoder_av"))
    if is_hdr(plan):  # the pack's SDR-to-HDR IC-LoRA file
        check_hdr_lora(plan, runner.pack(spec.pack).has("hdr_lora"))
    for sha, path in (media or {}).items():
        blobs.put_file(sha, path)
    plan = plan.resolve(text_encoder=resolve_local_text_encoder(plan, runner))
    check_enhancer(plan, LM_HEAD in runner.pack(spec.pack).components())  # --enhance-prompt: its Gemma writes
    if str(spec.decode_tiles).strip().lower() == "auto":  # this machine is the whole fleet: tile only if
        local = Fleet.of([{"packs": [spec.pack], "memory_bytes": device_memory_bytes()}])  # the decode would not fit
        plan = plan.resolve(decode_tiles=resolve_decode_tiles(window_view(plan.resolve(decode_tiles=None)), local))
    tasks = plan_render(plan, "local")
    runs: list[dict] = []
    outputs = run_plan(tasks, runner, blobs, _recording(runs, on_event))
    out_path = Path(out_path)

    def get(name: str, output: str) -> np.ndarray | None:
        sha = outputs.get(f"local.{name}", {}).get(output)
        return None if sha is None else blobs.get(sha)

    written = assemble_streaming(plan.as_dict(), get, out_path.parent / (out_path.stem + ".parts"), runs,
                                 exr_dir=exr_dir)
    if written.suffix != ".mp4":  # an audio-only render's WAV and M4A: -o's suffix picks one
        for file in AUDIO_FILES.values():
            if (written.parent / file).suffix == out_path.suffix.lower():
                written = written.parent / file
            else:
                (written.parent / file).unlink()
    written.replace(out_path)
    if plan.spec.hdr:  # the HLG master beside the mp4
        (written.parent / HLG_FILE).replace(hlg_path(out_path))
    (written.parent / "render.json").replace(out_path.with_suffix(".json"))
    written.parent.rmdir()
    return out_path, outputs, blobs


def predict_frames(plan: RenderPlan, runner: Runner) -> Resolved:
    """-f left out on a 2.5 pack: encode the prompt (the render's text task reuses it) and let the pack's
    DurationHead pick the length; what it picked, with the seconds it predicted, shown on stderr before
    stage 1 starts."""
    plan = plan.resolve(text_encoder=resolve_local_text_encoder(plan, runner))
    params = {"pack": plan.pack, "prompt": plan.prompt, **text_params(plan)}
    inputs = {}
    for enhance in plan_enhance("local", plan, text_params(plan))[0]:  # the head reads the enhanced prompt's
        inputs = dict(runner.run(enhance["kind"], enhance["params"], {})[0])
    contexts, _ = runner.run("text_encode", params, inputs)
    out, _ = runner.run("predict_duration", head_params(plan), contexts)
    frames, seconds = picked(out)
    print(length_line(frames, seconds, plan.spec.frame_rate), file=sys.stderr)
    return replace(plan.resolved, frames=frames, predicted_seconds=seconds)


def resolve_local_text_encoder(plan: RenderPlan, runner: Runner) -> str | None:
    """This machine is the whole fleet: the pack's own tower wins, else the encoder named (or the MLX
    port's default) must be here; PackError's one line with the fetch command when it is not."""
    pack = runner.pack(plan.pack)
    encoder = text_encoders.resolve(TEXT_ENCODER in pack.components(), plan.spec.text_encoder)
    runner.text_encoder_dir(pack, {"pack": plan.pack, "text_encoder": encoder})
    return encoder


def _recording(runs: list[dict], on_event: Callable[[dict], None] | None) -> Callable[[dict], None]:
    """Pass events on, and keep each task's run record (tasks run one after another here)."""
    last = [int(time.time() * 1000)]

    def handle(event: dict) -> None:
        if event.get("type") == "task_done":
            now = int(time.time() * 1000)
            runs.append({"name": str(event["task"]).removeprefix("local."), "kind": event.get("kind"),
                         "worker": "local", "start_ms": last[0], "end_ms": now, "seconds": event.get("seconds")})
            last[0] = now
        if on_event:
            on_event(event)

    return handle
