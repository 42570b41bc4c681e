"""DFR's base path at 0 temporal rounds (`dfr`: padded canvas, keyframe slots in both stages, the trim and
the decode's keyframes) and the spatial epilogue (`spatial_upscalings` 2: the carried planes rebuilt per
task, the detailing pass tiled 2x2 then 4x4 per step) on the tiny LTX-2.5 pack: one module farm, on 3
and then on 2 workers, every task output and the mp4's frames equal `farm render --local` bit for bit;
and DFR's epilogue after one temporal round (two windows, the second pinned on the first) on 2 workers;
bad DFR specs are refused at submit in one line with nothing queued."""

from __future__ import annotations

import time
from pathlib import Path

import av
import numpy as np
import pytest

from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from farm_cli.client import FarmError
from farm_cli.local import render_local
from ltx_engine.tiny_pack import DETAILING_LORA
from tests.farm.farm_harness import farm, wait_done, wait_until

BASE = {
    "prompt": "a fox",
    "frames": 41,
    "frame_rate": 24.0,
    "seed": 5,
    "pack": "tiny25",
    "decode_tiles": "off",
    "detailing_lora": DETAILING_LORA,
}
CASES = {
    "base_t0": {**BASE, "height": 128, "width": 192, "dfr": True},  # 41 -> a 49-frame canvas, slots 24 and 48
    "epilogue": {**BASE, "height": 128, "width": 128, "spatial_upscalings": 2, "audio": False},
}
# the epilogue after one temporal round: 2 windows, the second pinned on the first (2 workers only)
ROUNDS = {**CASES["epilogue"], "temporal_upscalings": 1}


@pytest.fixture(scope="module")
def packs25(tmp_path_factory) -> Path:
    from ltx_engine.tiny_pack import write_tiny_pack

    folder = tmp_path_factory.mktemp("packs25")
    write_tiny_pack(folder / "tiny25", seed=0, variant="2.5")
    write_tiny_pack(folder / "tiny", seed=0)
    return folder


@pytest.fixture(scope="module")
def references(packs25, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    from worker.runner import Runner

    runner, folder, out = Runner(packs25), tmp_path_factory.mktemp("dfr25-local"), {}
    for name, spec in {**CASES, "rounds": ROUNDS}.items():
        path, outputs, _ = render_local(dict(spec), folder / f"{name}.mp4", runner)
        out[name] = (path, {tid.removeprefix("local."): shas for tid, shas in outputs.items()})
    return out


@pytest.fixture(scope="module")
def dfr_farm(redis_server, packs25, tmp_path_factory):
    """One farm of 3 workers for the module (the 2-worker half drains one)."""
    client = connect(redis_server.url)
    client.flushdb()
    with farm(FarmStore(client), tmp_path_factory.mktemp("dfr25-data"), packs25, workers=3) as (
        farm_client,
        procs,
    ):
        wait_until(
            lambda: sum(bool((w.get("packs") or {}).get("tiny25")) for w in farm_client.workers()) == 3,
            60,
            "3 workers describing tiny25",
        )
        yield farm_client, procs
    client.close()


def _frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


@pytest.mark.timeout(600)
def test_base_path_and_epilogue_on_the_farm_equal_local(dfr_farm, references, tmp_path):
    client, procs = dfr_farm
    for workers in (3, 2):
        if workers == 2:
            assert client.drain("w3")
            procs["w3"].wait(timeout=60)
        for name, spec in {**CASES, **({"rounds": ROUNDS} if workers == 2 else {})}.items():
            start = time.monotonic()
            render_id = client.submit(dict(spec))
            render = wait_done(client, render_id, timeout=300)
            local_mp4, local_shas = references[name]
            shas = {t["id"].removeprefix(f"{render_id}."): t.get("outputs") or {} for t in render["tasks"]}
            assert shas == local_shas, (name, workers)  # every task output, planes and tiles included
            frames = _frames(client.fetch_output(render_id, tmp_path / f"{name}-{workers}.mp4"))
            want = (spec["frames"] - 1) * 2 ** spec.get("temporal_upscalings", 0) + 1
            assert len(frames) == want and frames[0].shape == (spec["height"], spec["width"], 3)
            assert all((a == b).all() for a, b in zip(frames, _frames(local_mp4), strict=True))
            ran = {
                t["worker"] for t in render["tasks"] if t.get("worker") and t["kind"] == "transformer_forward"
            }
            print(name, workers, f"{time.monotonic() - start:.1f} s", sorted(ran))
            if name == "rounds":  # window 1's prefix was cut from window 0's output, its tiles spread
                assert {"latent", "prefix", "audio"} <= set(shas["dfr.epi.w1.in"]) and len(ran) == workers
            if name == "epilogue":
                assert len(ran) == workers  # the epilogue's tiles spread over every worker
                assert (
                    local_shas["dfr.trim"]["keyframes"] == local_shas["dfr.epi.kf0"]["latent"]
                )  # slot 24 kept


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"spatial_upscalings": 3}, "spatial_upscalings 3 is outside 1..2"),
        ({"spatial_upscalings": 2, "height": 192}, "not a multiple of 128"),
        ({"dfr": True, "pack": "tiny"}, "is not an LTX-2.5 pack"),
    ],
)
def test_bad_dfr_specs_are_refused_at_submit(changes, message, dfr_farm):
    client, _procs = dfr_farm
    before = len(client.list())
    with pytest.raises(FarmError, match=message) as info:
        client.submit({**CASES["epilogue"], **changes})
    assert "\n" not in str(info.value)
    assert len(client.list()) == before
