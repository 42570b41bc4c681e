"""The lease script gives a text task only to a worker holding its text encoder under one of the names
the planner listed (real Redis); a worker that describes no encoders may take it."""

from __future__ import annotations

from coordinator.state.store import FarmStore
from ltx_engine.rules import text_encoders


def _task(tid: str, kind: str, params: dict) -> dict:
    return {"id": tid, "kind": kind, "params": {"pack": "p", **params}, "inputs": {}, "deps": [], "capability": "mlx"}


def test_text_tasks_go_only_to_workers_holding_their_encoder(store: FarmStore) -> None:
    ref = text_encoders.DEFAULT
    store.register_worker("lacks", {"pack_components": {"p": ["connector", "transformer"]}, "text_encoders": {}})
    store.register_worker("pulled", {"pack_components": {"p": ["connector"]}, "text_encoders": {"gemma-3-12b-it-4bit": 7}})
    store.register_worker("quiet", {"pack_components": {"p": ["connector"]}})
    text = _task("r.text", "text_encode", {"needs": ["connector"], "text_encoder": ref,
                                           "text_encoder_names": text_encoders.names(ref)})
    store.create_render("r", {"prompt": "fox"}, [text, _task("r.s1", "denoise_stage1", {"needs": ["transformer"]})])
    first = store.lease("lacks", ["mlx"], 10_000)
    assert first is not None and first["id"] == "r.s1"  # r.text is first in queue order, but not for this Mac
    assert store.lease("lacks", ["mlx"], 10_000) is None
    assert store.get_task("r.text")["state"] == "queued"
    leased = store.lease("pulled", ["mlx"], 10_000)  # holds it under the repo name `pack pull` gave it
    assert leased is not None and leased["id"] == "r.text"


def test_a_worker_describing_no_encoders_takes_the_text_task(store: FarmStore) -> None:
    store.register_worker("quiet", {"pack_components": {"p": ["connector"]}})
    store.create_render("r2", {"prompt": "fox"}, [_task("r2.text", "text_encode", {
        "needs": ["connector"], "text_encoder": "org/g", "text_encoder_names": ["org/g", "g"]})])
    leased = store.lease("quiet", ["mlx"], 10_000)
    assert leased is not None and leased["id"] == "r2.text"
