"""Sequence-parallel stage 1 as a gang lease on a real farm (issue #25): k workers at once, the group
handed out by the coordinator, the ranks in child processes under a watchdog; every render equals
`farm render --local` bit for bit, whatever happened to the gang."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from farm_cli.local import render_local
from tests.farm.chaos import assert_same_outputs
from tests.farm.farm_harness import farm, wait_done, wait_until

BASE = {"prompt": "a fox", "height": 256, "width": 384, "frames": 25, "frame_rate": 24.0, "seed": 3, "pack": "tiny",
        "stage2_tiles": "2x2", "tile_overlap": 5, "decode_tiles": "32,256,256"}


@pytest.fixture(scope="module")
def reference(local_runner, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sp-local")
    _, outputs, _ = render_local({**BASE, "stage1_parallel": "1"}, folder / "local.mp4", local_runner)
    return outputs


def _stage1(render: dict) -> dict:
    return next(t for t in render["tasks"] if t["kind"] == "denoise_stage1")


def _events(client, render_id: str) -> list[dict]:
    return list(client.watch(render_id, timeout=5))


@pytest.mark.timeout(240)
def test_gang_of_two_and_three_equals_local(store, tmp_data, tiny_packs, reference):
    with farm(store, tmp_data, tiny_packs, workers=3) as (client, _procs):
        wait_until(lambda: len(client.workers()) == 3, 60, "3 workers registered")
        for k in (3, 2):
            render = wait_done(client, client.submit({**BASE, "stage1_parallel": str(k)}))
            assert_same_outputs(render["tasks"], render["id"], reference)
            s1 = _stage1(render)
            started = [e for e in _events(client, render["id"]) if e.get("type") == "gang_started"]
            print(k, s1["metrics"].get("stage1_parallel"), s1["metrics"].get("seconds"), started)
            assert s1["metrics"]["stage1_parallel"] == k and started and started[0]["degree"] == k
