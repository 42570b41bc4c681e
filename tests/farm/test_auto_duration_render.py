"""`--auto-duration MIN:MAX` on a real tiny LTX-2.5 render: the pack's DurationHead predicts ~2.1 s (49
frames at 24 fps unbounded); a 3:4 range holds its pick to 73 frames (3.04 s), recorded with the seconds
it predicted; the farm (the head on a worker, the range in its task's params) equals `--local` bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest

from farm_cli.local import render_local
from ltx_engine.rules.duration import frames_for
from tests.farm.farm_harness import farm, wait_done
from tests.farm.test_cli_length import _described
from tests.session_fixtures import link_packs

SPEC = {"prompt": "a fox walks through snow", "height": 64, "width": 64, "frame_rate": 24.0, "seed": 3,
        "pack": "tiny25", "decode_tiles": "off", "audio": False}


@pytest.fixture(scope="module")
def packs(tiny25_pack, tmp_path_factory) -> Path:
    return link_packs(tmp_path_factory.mktemp("packs-auto-duration"), tiny25=tiny25_pack)


def _frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


@pytest.mark.timeout(900)
def test_the_range_holds_the_heads_pick_on_the_farm_as_locally(packs, runner25, store, tmp_data,
                                                               tmp_path: Path) -> None:
    mp4, _, _ = render_local({**SPEC, "auto_duration": [3.0, 4.0]}, tmp_path / "ranged.mp4", runner25)
    spec = json.loads(mp4.with_suffix(".json").read_text())["spec"]
    seconds = spec["predicted_seconds"]
    assert frames_for(seconds, 24.0) == 49 and seconds < 3.0  # unbounded, the head picks 49 frames
    assert spec["frames"] == frames_for(seconds, 24.0, 3.0, 4.0) == 73 and spec["auto_duration"] == [3.0, 4.0]
    local = _frames(mp4)
    assert len(local) == 73
    with farm(store, tmp_data, packs, workers=1) as (client, _procs):
        _described(client, "tiny25")  # the pack's generation is known once its holder describes it
        render = wait_done(client, client.submit({**SPEC, "auto_duration": [3.0, 4.0]}), timeout=800)
        fetched = client.fetch_output(render["id"], tmp_path / "farm.mp4")
    assert render["spec"]["frames"] == 73 and render["spec"]["predicted_seconds"] == seconds
    head = next(t for t in render["tasks"] if t["id"].endswith(".length.head"))
    assert (head["params"]["min_seconds"], head["params"]["max_seconds"]) == (3.0, 4.0)
    assert all(np.array_equal(a, b) for a, b in zip(_frames(fetched), local, strict=True))
