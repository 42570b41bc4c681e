"""Words and times people read about a render: a task's human name and the ETA from measured speeds.

Pure functions over task views (coordinator.metrics.task_view); the measured speeds are the farm's
per-kind lease-to-done means (`{p}:kindtime:{kind}`, written by complete.lua), read by metrics.
"""

from __future__ import annotations

from collections.abc import Mapping

# What each task kind does, in the words the dashboard and `farm status` use (never s0, cut, prep).
KIND_LABELS = {
    "text_encode": "text encoding",
    "image_encode": "image encoding",
    "denoise_stage1": "stage 1 denoise",
    "upsample_spatial": "spatial upsample",
    "upsample_temporal": "temporal upsample",
    "denoise_stage2": "stage 2 denoise",
    "stage_prepare": "prepare stage 2 inputs",
    "tdp_cut": "cut into tiles",
    "tdp_step": "blend tiles + sampler step",
    "transformer_forward": "tile",
    "dfr_tile": "tile",
    "dfr_stitch": "stitch round",
    "dfr_trim": "trim to length",
    "dfr_epi_window": "cut epilogue window",
    "dfr_keyframe_plane": "rebuild keyframe",
    "decode_video": "video decode",
    "decode_tile": "decode tile",
    "decode_audio": "audio decode",
    "audio_encode": "audio encode",  # issue #24: A2V's track, a clip's own track
    "video_encode": "encode tile",  # issue #24: one tile of a source clip
    "video_encode_blend": "blend encode tiles",
    "hdr_stage": "HDR IC-LoRA denoise",  # issue #29
}
_ENDED = ("done", "cancelled")


# Stage order of the pipeline, as shown on the timeline; "mux" is the coordinator's assembly.
STAGES: tuple[tuple[str, str], ...] = (
    ("text", "Text"),
    ("length", "Length"),  # an LTX-2.5 render's DurationHead picking its length (plan_length)
    ("image", "Image"),
    ("source", "Source"),  # issue #24: a source clip's tiled encode (`source_encode`)
    ("stage1", "Stage 1"),
    ("upsample", "Upsample"),
    ("stage2", "Stage 2"),
    ("dfr", "DFR"),
    ("decode", "Decode"),
    ("audio", "Audio"),
    ("mux", "Mux"),
)


def task_label(kind: str, step: object = None, tile_index: object = None, round_: object = None) -> str:
    """A task's name for people: 'tile 3', 'blend tiles + sampler step 2', 'video decode'."""
    label = KIND_LABELS.get(kind, kind.replace("_", " ") or "task")
    if isinstance(tile_index, int):
        label += f" {tile_index + 1}"
    if kind == "tdp_step" and isinstance(step, int):
        label += f" {step + 1}"
    if isinstance(round_, int) and kind.startswith("dfr"):
        label += f" (round {round_})"
    return label


def _stage_seconds(tasks: list[dict], speeds: Mapping[str, float], workers: int, now_ms: int) -> float | None:
    """A stage's time left: its tasks share the workers, but no faster than its longest task left."""
    left = []
    for t in tasks:
        mean = speeds.get(t["kind"])
        if mean is None:
            return None
        ran = (now_ms - t["leased_ms"]) / 1000.0 if t["display"] in ("leased", "running") and t["leased_ms"] else 0.0
        left.append(max(0.0, mean - ran))
    return max(max(left), sum(left) / max(1, workers))


def eta_from_speeds(views: list[dict], stage_order: list[str], speeds: Mapping[str, float], workers: int,
                    now_ms: int) -> float | None:
    """Seconds until the render's tasks are done: stages one after another, each from the measured mean
    time of its task kinds spread over the live workers. None when a kind left has no measurement yet."""
    by_stage: dict[str, list[dict]] = {}
    for v in views:
        if v["display"] not in _ENDED:
            by_stage.setdefault(v["stage"], []).append(v)
    total = 0.0
    for stage in sorted(by_stage, key=lambda s: stage_order.index(s) if s in stage_order else len(stage_order)):
        seconds = _stage_seconds(by_stage[stage], speeds, workers, now_ms)
        if seconds is None:
            return None
        total += seconds
    return total
