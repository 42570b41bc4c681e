"""A worker whose pack is a damaged copy (same name, same files, one tensor per file transposed: it
registers fine and every task it runs raises on load) is blocklisted for the render after 3 failures;
the render finishes on the healthy workers, byte-identical to --local, and `farm workers` says so until
`farm requeue` clears it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.farm.chaos import ChaosFarm, assert_same_outputs, spec
from tests.farm.farm_harness import ROOT, wait_done


def damaged_copy(packs: Path, to: Path) -> Path:
    """The packs folder copied, with one 2-D tensor of every weight file transposed in its header: the
    bytes still add up, so only loading the model finds it (as a bad copy or a bad converter would)."""
    shutil.copytree(packs, to)
    for f in to.rglob("*.safetensors"):
        raw = f.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8 : 8 + n])
        for name, t in header.items():
            if name != "__metadata__" and len(t["shape"]) == 2 and t["shape"][0] != t["shape"][1]:
                t["shape"] = t["shape"][::-1]
                break
        text = json.dumps(header, separators=(",", ":")).encode()
        f.write_bytes(raw[:8] + text.ljust(n) + raw[8 + n :])
    return to


def _wait(ok: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def farm_cli(farm: ChaosFarm, *args: str) -> str:
    run = subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", *args,
                          "--coordinator", farm.address],
                         capture_output=True, text=True, cwd=ROOT, timeout=60, env={**os.environ, "FARM_TOKEN": farm.token})
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.mark.timeout(300)
def test_a_worker_failing_every_task_is_blocklisted_and_the_render_finishes(
        store, tmp_data, tiny_packs, local_reference, tmp_path):
    _, local_outputs, _ = local_reference(spec(0))
    bad_packs = damaged_copy(tiny_packs, tmp_path / "bad-packs")
    # The good workers are frozen but must stay counted (registered, attached): the coordinator pings
    # peers only every 120 s here, so their connections outlive the freeze (by default a frozen Mac is
    # lost within seconds, and a render whose other workers are all lost fails: test_failure_policy).
    with ChaosFarm(store, tmp_data, tiny_packs, workers=2, ping_ms=120_000) as farm:
        _wait(lambda: {w["id"] for w in store.list_workers() if w.get("session")} == {"w1", "w2"})
        for w in ("w1", "w2"):  # registered and live, but frozen while the bad one meets the render
            farm.kill(w, signal.SIGSTOP)
        time.sleep(1.0)  # their last long polls (500 ms) end
        farm.names.append("bad")
        farm.start("bad", packs=bad_packs)
        rid = farm.client.submit(spec(0))
        _wait(lambda: store.get_render(rid)["blocklist"] == ["bad"], 120)
        shown = farm_cli(farm, "workers")
        cleared = farm_cli(farm, "requeue", rid)  # a second chance: it fails three more and is out again
        _wait(lambda: store.get_render(rid)["blocklist"] == ["bad"], 120)
        for w in ("w1", "w2"):
            farm.kill(w, signal.SIGCONT)
        render = wait_done(farm.client, rid, 240)
        failed_there = [t for t in render["tasks"] if "bad" in t.get("failed_on", [])]
    print(shown)
    assert render["blocklist"] == ["bad"] and sum(t["failures"] for t in failed_there) >= 6
    assert all(t["worker"] in ("w1", "w2", "coordinator") for t in render["tasks"])
    assert_same_outputs(render["tasks"], rid, local_outputs)
    line = next(line for line in shown.splitlines() if line.startswith("bad "))
    assert f"blocklisted for {rid}" in line
    assert f"{rid}: blocklist cleared" in cleared
    kinds = [e["type"] for _, e in store.read_events(rid, count=10_000)
             if e["type"] in ("worker_blocklisted", "blocklist_cleared")]
    assert kinds == ["worker_blocklisted", "blocklist_cleared", "worker_blocklisted"]
