"""A prompt per moment (`--segment TEXT SECONDS`, the MLX port's Prompt Relay) on the tiny pack: `--local`
with two segments differs from the render without them and gives the same bits twice; on 2 workers, with
stage 2 cut into tiles over time, every task's output and the frames are `--local`'s bit for bit; a guided
step masks every pass but the uncond one; segments that cannot be relayed are one line at submit (exit 2
from `farm submit`), nothing queued. One farm for the module, small frames."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from farm_cli.client import FarmError
from farm_cli.local import render_local
from ltx_engine.rules.prompt_relay import RELAY, RelayError, RelayTable
from ltx_engine.tiny.tiny_tokenizer import build_tiny_tokenizer
from tests.farm.farm_harness import ROOT, ModuleFarm, farm, farm_results, join_token, local_results, wait_done

PROMPT = "a fox in a field"
SEGMENTS = [{"text": "the fox sleeps", "seconds": 0.5}, {"text": "the fox runs", "seconds": 0.54}]
SPEC = {"prompt": PROMPT, "height": 128, "width": 128, "frames": 25, "seed": 5, "pack": "tiny",
        "decode_tiles": "off", "stage2_tiles": "2x1x1", "tile_overlap": 1, "segments": SEGMENTS}
PLAIN = {k: v for k, v in SPEC.items() if k != "segments"}


def _outputs(outputs: dict) -> dict[str, dict[str, str]]:
    return {tid.removeprefix("local."): out for tid, out in outputs.items()}


@pytest.fixture(scope="module")
def reference(local_runner, tmp_path_factory):
    """`--local` with the segments (twice) and without: {name: (task outputs, arrays, blobs)}."""
    folder, done = tmp_path_factory.mktemp("relay-local"), {}
    for name, spec in (("relay", SPEC), ("again", SPEC), ("plain", PLAIN)):
        _, outputs, blobs = render_local(dict(spec), folder / f"{name}.mp4", local_runner)
        done[name] = (_outputs(outputs), local_results(outputs, blobs), blobs)
    return done


@pytest.fixture(scope="module")
def relay_farm(mstore, tiny_packs, tmp_path_factory):
    data = tmp_path_factory.mktemp("relay-farm")
    with farm(mstore, data, tiny_packs, workers=0, shelf=tiny_packs) as (client, procs):  # as `farm up`
        yield ModuleFarm(client, procs, data, tiny_packs)


@pytest.mark.timeout(300)
def test_local_with_segments_differs_from_without_and_repeats(reference):
    outputs, arrays, blobs = reference["relay"]
    assert outputs == reference["again"][0]  # every task's output, bit for bit, twice
    plain = reference["plain"][1]
    for name in ("stage1_video", "stage2_video", "frames"):
        assert not np.array_equal(arrays[name], plain[name]), name
    table = RelayTable.from_array(blobs.get(outputs["text"][RELAY]))
    encode = build_tiny_tokenizer().encode
    first, second = (len(encode(PROMPT + text).ids) for text in (" the fox sleeps", " the fox sleeps the fox runs"))
    assert table.segments == ((len(encode(PROMPT).ids), first, 0.0, 0.5), (first, second, 0.5, 1.04))
    assert (table.fps, table.epsilon, table.strength) == (24.0, 1e-3, 1.0)
    assert RELAY not in reference["plain"][0]["text"]


@pytest.mark.timeout(300)
def test_two_segments_on_2_workers_equal_local(relay_farm, reference):
    relay_farm.workers(2)
    render = wait_done(relay_farm.client, relay_farm.client.submit(dict(SPEC)), timeout=240)
    outputs, arrays, _ = reference["relay"]
    tasks = {t["id"].removeprefix(f"{render['id']}."): t for t in render["tasks"]}
    assert {name: t.get("outputs") or {} for name, t in tasks.items()} == outputs  # the whole set, bit for bit
    farm_arrays = farm_results(relay_farm.client, render)
    for name in arrays:
        np.testing.assert_array_equal(farm_arrays[name], arrays[name], err_msg=name)
    tiles = [t for t in tasks.values() if t["kind"] == "transformer_forward"]
    assert len(tiles) == 2 * 2 and all(RELAY in t["inputs"] for t in tiles)  # 2 tiles over time x 2 TDP steps
    assert {t.get("worker") for t in tasks.values() if t.get("worker")} <= {"w1", "w2", "coordinator"}


@pytest.mark.timeout(300)
def test_a_guided_step_masks_every_pass_but_the_uncond(tiny_dev_pack, tmp_path):
    """One-stage on the dev pack: with the segments the uncond pass (the negative prompt's contexts) gives the
    same x0 as without them, as the port leaves it unmasked; the cond, STG and modality passes differ."""
    from tests.session_fixtures import link_packs
    from worker.runner import Runner

    runner = Runner(link_packs(tmp_path / "packs", dev=tiny_dev_pack))
    one = {"prompt": PROMPT, "height": 64, "width": 64, "frames": 25, "seed": 3, "pack": "dev", "decode_tiles": "off",
           "pipeline": "one-stage", "steps": 2, "stg_blocks": [1], "negative_prompt": "blurry"}
    relay = _outputs(render_local({**one, "segments": SEGMENTS}, tmp_path / "relay.mp4", runner)[1])
    plain = _outputs(render_local(one, tmp_path / "plain.mp4", runner)[1])
    assert relay["negative"] == plain["negative"] and relay["stage1.s0.uncond"] == plain["stage1.s0.uncond"]
    for name in ("cond", "perturbed", "isolated"):
        assert relay[f"stage1.s0.{name}"] != plain[f"stage1.s0.{name}"], name


@pytest.mark.timeout(120)
def test_a_prompt_the_encoder_would_cut_fails_its_text_task_at_once(local_runner):
    """Over the encoder's 1024 tokens the encoder would cut the segments' words: the text task refuses, a
    permanent fault (every worker would), so the render fails once instead of being retried."""
    from protos.states import Fault
    from worker.faults import classify

    relay = {"segments": [["the fox runs", 0.0, 1.0]], "fps": 24.0, "epsilon": 1e-3, "strength": 1.0}
    with pytest.raises(RelayError) as err:
        local_runner.run("text_encode", {"pack": "tiny", "prompt": "a fox " * 600, RELAY: relay}, {})
    assert "past the text encoder's 1024" in str(err.value) and classify(err.value) == Fault.PERMANENT


BAD = [
    ({"segments": [*SEGMENTS, {"text": "it rests", "seconds": 0.5}]}, "--segment 'it rests' ends at 1.54 s, past the "
     "clip's end (25 frames at 24 fps = 1.04167 s)"),
    ({"segments": [{"text": "the fox sleeps", "seconds": 0.55}, {"text": "blink", "seconds": 0.05}]},  # px 13.2..14.4
     "--segment 'blink' (0.05 s from 0.55 s) holds no latent frame"),
    ({"segments": SEGMENTS, "pipeline": "t2a", "stage2_tiles": None, "decode_tiles": "auto"},
     "--segment does not apply to the t2a recipe"),
    ({"relay_epsilon": 0.01}, "--relay-epsilon needs one of --segment"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad,line", BAD, ids=["outside", "too-short", "t2a", "knob-alone"])
def test_segments_that_cannot_be_relayed_are_refused_at_submit(bad, line, relay_farm, mstore):
    before = len(mstore.list_renders())
    with pytest.raises(FarmError) as info:
        relay_farm.client.submit({**PLAIN, **bad})
    assert "\n" not in str(info.value) and line in str(info.value), info.value
    assert len(mstore.list_renders()) == before


@pytest.mark.timeout(120)
def test_farm_submit_refuses_in_one_line_with_exit_2(relay_farm, mstore):
    from coordinator.api.auth import load_or_create_token

    token = join_token(relay_farm.data, load_or_create_token(relay_farm.data))
    env = {"PATH": "/usr/bin:/bin", "FARM_DATA": str(ROOT / "nonexistent-farm-data"), "HOME": "/nonexistent",
           "FARM_TOKEN": token}
    before = len(mstore.list_renders())
    args = ["-p", PROMPT, "-H", "128", "-W", "128", "-f", "25", "--segment", "the fox sleeps", "0.5",
            "--segment", "the fox runs", "2", "--coordinator", str(relay_farm.client.endpoints)]
    result = subprocess.run([sys.executable, "-c", "from farm_cli.main import main; main()", "submit", *args],
                            capture_output=True, text=True, cwd=ROOT, timeout=60, env=env)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--segment 'the fox runs' ends at 2.5 s, past the clip's end" in lines[0], lines
    assert len(mstore.list_renders()) == before
