"""The prompt-embedding cache: renders with the same pack, prompt and encoder encode the prompt once.
In the store (real Redis): a second text task waits while the first runs, then moves to the coordinator
with the first's embeddings; collected blobs are encoded again. On a real farm: `--seeds 1-4` runs one
text encoding on a worker, and a render that reused it is bit-identical to `farm render --local`."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.plan.render import normalize_spec, text_key
from coordinator.state.store import FarmStore
from farm_cli.local import render_local
from farm_cli.manage import batch_specs
from tests.farm.farm_harness import assert_identical, farm, farm_results, local_results, wait_done

KEY = "k" * 64


def _render(store: FarmStore, rid: str, key: str = KEY) -> None:
    text = {"id": f"{rid}.text", "kind": "text_encode", "params": {"pack": "tiny", "prompt": "fox", "text_key": key},
            "inputs": {}, "deps": [], "capability": "mlx"}
    after = {"id": f"{rid}.s1", "kind": "denoise_stage1", "params": {}, "deps": [f"{rid}.text"], "capability": "mlx",
             "inputs": {"ctx": {"task": f"{rid}.text", "output": "video_context"}}}
    store.create_render(rid, {"prompt": "fox"}, [text, after])


def test_a_second_text_task_waits_then_reuses_the_first(store: FarmStore) -> None:
    for w in ("w1", "w2"):
        store.register_worker(w, {})
    _render(store, "a")
    _render(store, "b")
    first = store.lease("w1", ["mlx"], 60_000)
    assert first["id"] == "a.text"
    assert store.lease("w2", ["mlx"], 60_000) is None  # b.text waits for a.text's embeddings
    store.put_blob_ref("e" * 64, "/nowhere", 1)
    store.complete("a.text", "w1", first["fence"], {"video_context": "e" * 64}, {})
    got = store.lease("w2", ["mlx"], 60_000)
    assert got["id"] == "a.s1"  # b.text went to the coordinator, not to a worker
    handed = store.lease("coordinator", ["coordinator"], 60_000)
    assert handed["id"] == "b.text" and handed["inputs"] == {"video_context": "e" * 64}


def test_a_peek_names_what_the_lease_takes_and_moves_no_text_task(store: FarmStore) -> None:
    """Upcoming's peek (store.peek_lease) follows the cache's rule without applying it: the lease does."""
    store.register_worker("w1", {})
    _render(store, "a")
    _render(store, "b")
    first = store.lease("w1", ["mlx"], 60_000)
    store.put_blob_ref("e" * 64, "/nowhere", 1)
    store.complete("a.text", "w1", first["fence"], {"video_context": "e" * 64}, {})
    ready = store.client.zrange(store.key("ready", "mlx"), 0, -1)
    assert store.peek_lease("w1", ["mlx"], [])["id"] == "a.s1"  # b.text is the coordinator's to hand over
    assert store.client.zrange(store.key("ready", "mlx"), 0, -1) == ready and "b.text" in ready  # not moved
    assert store.lease("w1", ["mlx"], 60_000)["id"] == "a.s1"
    assert store.lease("coordinator", ["coordinator"], 60_000)["id"] == "b.text"  # the lease moved it


def test_embeddings_whose_blobs_were_collected_are_encoded_again(store: FarmStore) -> None:
    store.register_worker("w1", {})
    _render(store, "a")
    first = store.lease("w1", ["mlx"], 60_000)
    store.complete("a.text", "w1", first["fence"], {"video_context": "f" * 64}, {})  # no blob record: collected
    _render(store, "b")
    assert store.lease("w1", ["mlx"], 60_000)["id"] == "a.s1"
    assert store.lease("w1", ["mlx"], 60_000)["id"] == "b.text"


def test_the_key_follows_pack_prompt_and_encoder() -> None:
    def plan(**asked):
        return normalize_spec({"prompt": "a fox", "pack": "tiny", **asked})

    spec = plan()
    assert text_key(spec) == text_key(plan(seed=7, height=512))
    assert len({text_key(spec), text_key(plan(prompt="a cat")), text_key(spec.resolve(text_encoder="pack")),
                text_key(plan(pack="other"))}) == 4


@pytest.mark.timeout(600)
def test_a_seed_sweep_encodes_its_prompt_once(store, tmp_data, tiny_packs, local_runner, tmp_path):
    spec = {"prompt": "a paper boat on a pond", "height": 256, "width": 384, "frames": 9, "frame_rate": 24.0,
            "seed": 1, "pack": "tiny", "audio": False}
    with farm(store, tmp_data, tiny_packs, workers=3) as (client, _procs):
        ids = [client.submit(s) for s in batch_specs(spec, "1-4", None)]
        renders = [wait_done(client, rid, timeout=500) for rid in ids]
        reused = next(r for r in renders if next(t for t in r["tasks"] if t["kind"] == "text_encode")["worker"]
                      == "coordinator")
        arrays = farm_results(client, reused)
    texts = [t for r in renders for t in r["tasks"] if t["kind"] == "text_encode"]
    assert len(texts) == 4
    assert sum(t["worker"] != "coordinator" for t in texts) == 1, [t["worker"] for t in texts]
    assert len({tuple(sorted(t["outputs"].items())) for t in texts}) == 1
    _, outputs, blobs = render_local({**spec, "seed": reused["spec"]["seed"]}, tmp_path / "l.mp4", local_runner)
    assert_identical(arrays, local_results(outputs, blobs))


@pytest.mark.timeout(600)
def test_an_enhanced_sweep_enhances_once_and_equals_local(store, tmp_data, tiny_packs, local_runner, tmp_path):
    """`--enhance-prompt` on 2 workers: the pack's Gemma writes the prompt once for a 2-seed sweep (greedy:
    the second render's enhance task is the cache's), the text task encodes what it wrote, and the render
    is `--local`'s bit for bit."""
    from farm_cli.renders import enhanced_prompt
    from farm_cli.views import render_details
    from protos.tensors import prompt_text

    spec = {"prompt": "a kite over a beach", "height": 256, "width": 384, "frames": 9, "frame_rate": 24.0,
            "seed": 1, "pack": "tiny", "audio": False, "enhance_prompt": True}
    with farm(store, tmp_data, tiny_packs, workers=2) as (client, _procs):
        ids = [client.submit(s) for s in batch_specs(spec, "1-2", None)]
        renders = [wait_done(client, rid, timeout=500) for rid in ids]
        arrays = farm_results(client, renders[0])
        shown = [enhanced_prompt(client, r) for r in renders]  # what `farm status ID` prints
    enhances = [t for r in renders for t in r["tasks"] if t["kind"] == "enhance_prompt"]
    assert len(enhances) == 2 and sum(t["worker"] != "coordinator" for t in enhances) == 1
    assert len({tuple(sorted(t["outputs"].items())) for t in enhances}) == 1
    _, outputs, blobs = render_local({**spec, "seed": renders[0]["spec"]["seed"]}, tmp_path / "l.mp4", local_runner)
    assert_identical(arrays, local_results(outputs, blobs))
    enhanced = prompt_text(blobs.get(outputs["local.enhance"]["prompt"]))
    assert enhanced and enhanced != spec["prompt"]
    assert shown == [enhanced, enhanced] and f"  enhanced   {enhanced}" in render_details(renders[0], shown[0])
    plain = local_runner.run("text_encode", {"pack": "tiny", "prompt": enhanced}, {})[0]
    np.testing.assert_array_equal(plain["video_context"], blobs.get(outputs["local.text"]["video_context"]))
