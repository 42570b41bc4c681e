"""Task names for people and the ETA from measured per-kind speeds (pure functions)."""

from __future__ import annotations

from coordinator.views.eta import render_eta
from coordinator.views.metrics import STAGES
from coordinator.views.progress import eta_from_speeds, task_label

ORDER = [s for s, _ in STAGES]


def view(stage: str, kind: str, display: str, leased_ms: int = 0) -> dict:
    return {"stage": stage, "kind": kind, "display": display, "leased_ms": leased_ms, "progress": {}}


def test_labels_never_show_internal_names() -> None:
    assert task_label("tdp_cut") == "cut into tiles"
    assert task_label("stage_prepare") == "prepare stage 2 inputs"
    assert task_label("tdp_step", step=0) == "blend tiles + sampler step 1"
    assert task_label("transformer_forward", step=1, tile_index=2) == "tile 3"


def test_eta_adds_stages_and_spreads_tiles_over_workers() -> None:
    speeds = {"denoise_stage1": 40.0, "transformer_forward": 10.0, "decode_video": 5.0}
    views = [view("stage1", "denoise_stage1", "running", leased_ms=10_000),  # 30 s in: 10 s left
             *[view("stage2", "transformer_forward", "queued") for _ in range(4)],  # 40 s over 2 workers
             view("decode", "decode_video", "waiting")]
    assert eta_from_speeds(views, ORDER, speeds, workers=2, now_ms=40_000) == 10 + 20 + 5
    assert eta_from_speeds(views, ORDER, {"denoise_stage1": 40.0}, 2, 40_000) is None  # unmeasured kinds


def test_summary_eta_is_not_linear_in_elapsed_time() -> None:
    """The issue's case: at 49 s of a 97 s render most of the graph's tasks are done, but the slow ones
    are left; the linear estimate said "6 s left", the measured speeds say what remains."""
    views = [*[view("text", "text_encode", "done") for _ in range(16)],
             view("stage2", "denoise_stage2", "running", leased_ms=40_000), view("decode", "decode_video", "waiting")]
    render = {"id": "r", "state": "running", "started_ms": 1, "created_ms": 1, "spec": {}}
    linear = render_eta(render, views, 49_000, None, None, None, 1)
    measured = render_eta(render, views, 49_000, None, None, {"denoise_stage2": 40.0, "decode_video": 8.0}, 1)
    assert linear < 10 and measured == 31 + 8
