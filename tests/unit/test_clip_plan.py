"""The retake / extend graphs (retake/extend, `coordinator/plan/clip.py`), their spec records
and the coordinator's extend kinds. Pure: no model, no farm."""

from __future__ import annotations

import re

import numpy as np
import pytest

from coordinator.plan import render as planner
from coordinator.plan.graph import SpecError
from coordinator.reduce.encode_blend import ENCODE_STEPS
from ltx_engine import media_pipelines
from ltx_engine.rules import extend
from protos.spec import RenderSpec

pytestmark = pytest.mark.timeout(60)
SOURCE = {"blob": "ab" * 32, "name": "clip.mp4"}
BASE = {"prompt": "a fox", "height": 128, "width": 192, "frames": 33, "pack": "tiny", "source_video": SOURCE}


def _plan(source_audio: bool | None = None, **extra) -> tuple[dict, dict]:
    plan = planner.validate_spec(RenderSpec.from_dict({**BASE, **extra}), [])
    if source_audio is not None:
        plan = plan.resolve(source_audio=source_audio)
    tasks = planner.plan_render(plan, "r")
    return {t["id"].removeprefix("r."): t for t in tasks}, plan.as_dict()


def test_retake_is_one_full_size_stage_over_the_source_latents():
    tasks, stored = _plan(retake={"start": 0.4, "end": 0.9, "regen_audio": False})
    stage = tasks["stage1"]
    assert [t["kind"] for t in tasks.values()].count("denoise_stage1") == 1
    assert not {"upsample", "stage2"} & set(tasks)
    assert (stage["params"]["height"], stage["params"]["width"], stage["params"]["sampler"]) == (
        128,
        192,
        "euler",
    )
    assert stage["params"]["retake"] == [0.4, 0.9, False] and len(stage["params"]["sigmas"]) == 9
    assert stage["inputs"]["latent"] == {"task": "r.source_encode", "output": "latent"}
    assert stage["inputs"]["audio_latent"] == {"task": "r.source_audio", "output": "latent"}
    assert tasks["source_audio"]["params"]["start"] == 0.0 and tasks["source_audio"]["kind"] == "audio_encode"
    assert tasks["decode"]["inputs"]["latent"]["task"] == "r.stage1"
    assert tasks["audio"]["inputs"]["latent"] == {"task": "r.stage1", "output": "audio_latent"}
    assert stored["retake"] == {"start": 0.4, "end": 0.9, "regen_audio": False}
    silent, stored = _plan(False, retake={"start": 0.4, "end": 0.9})
    assert "source_audio" not in silent and "audio_latent" not in silent["stage1"]["inputs"]
    assert stored["source_audio"] is False


def test_dev_retake_is_one_guided_full_size_stage_pinned_as_the_distilled_one():
    """`--pipeline one-stage`: the same window on the stage's prepare, the passes on the dev DiT."""
    tasks, _ = _plan(pack="dev", pipeline="one-stage", steps=2, stg_blocks=[1],
                     retake={"start": 0.4, "end": 0.9, "regen_audio": False})
    prep = tasks["stage1.prep"]
    assert prep["kind"] == "stage_prepare" and prep["params"]["retake"] == [0.4, 0.9, False]
    assert (prep["params"]["height"], prep["params"]["width"]) == (128, 192)
    assert prep["inputs"] == {"latent": {"task": "r.source_encode", "output": "latent"},
                              "audio_latent": {"task": "r.source_audio", "output": "latent"}}
    kinds = [t["kind"] for t in tasks.values()]
    assert kinds.count("guidance_pass") == 8 and kinds.count("guide_step") == 2 and "denoise_stage1" not in kinds
    assert tasks["negative"]["kind"] == "text_encode" and tasks["stage1"]["kind"] == "guide_step"
    assert tasks["audio"]["inputs"]["latent"] == {"task": "r.stage1", "output": "audio_latent"}


def test_dev_extend_is_the_two_stage_dev_recipes_stages_pinned_as_the_distilled_ones():
    """`--pipeline two-stage`: stage 1's prepare pins the half-size context and the boundary audio, stage 2
    runs on dev + the distilled LoRA with the full-size context; the join reads stage 1's audio."""
    tasks, _ = _plan(pack="dev", pipeline="two-stage", stage1_steps=2, stage2_steps=1, stg_blocks=[1],
                     extend={"frames": 1})
    prep = tasks["stage1.prep"]
    assert (prep["params"]["frames"], prep["params"]["height"], prep["params"]["audio_pin_start"]) == (33, 64, 0)
    assert prep["inputs"]["context"]["task"] == "r.context_s1" and prep["inputs"]["audio_pin"]["task"] == "r.audio_pin"
    assert [t["kind"] for t in tasks.values()].count("guidance_pass") == 8 and "denoise_stage1" not in {
        t["kind"] for t in tasks.values()}
    stage2 = tasks["stage2"]
    assert stage2["params"]["distilled_lora_strength"] == 1.0 and stage2["inputs"]["context"]["task"] == "r.context_s2"
    assert tasks["join"]["inputs"]["window_audio"] == {"task": "r.stage1", "output": "audio_latent"}


@pytest.mark.parametrize("direction", ["after", "before"])
def test_extend_pins_the_boundary_in_both_stages_and_joins_before_one_decode(direction):
    tasks, stored = _plan(extend={"frames": 2, "direction": direction})
    assert stored["output_frames"] == 33 + 16
    first = 33 - 25 if direction == "after" else 0
    for name, size in (("context_s1", (25, 64, 96)), ("context_s2", (25, 128, 192))):
        blend = tasks[name]["params"]
        assert (blend["frames"], blend["height"], blend["width"]) == size
        assert tasks[f"{name}.t0"]["params"]["first"] == first
    s1, s2 = tasks["stage1"], tasks["stage2"]
    assert s1["params"]["frames"] == s2["params"]["frames"] == 25 + 16
    image = {
        "input": "context",
        "frame": 0 if direction == "after" else 9,
        "strength": 1.0,
        "binding": "replace",
    }
    assert s1["params"]["images"] == s2["params"]["images"] == [image]
    assert (
        s1["inputs"]["context"]["task"] == "r.context_s1"
        and s2["inputs"]["context"]["task"] == "r.context_s2"
    )
    lay = extend.ExtendLayout(33, 24.0, 2, direction)
    assert s1["params"]["audio_pin_start"] == lay.audio_pin_start
    cut = lay.source_audio_slice(34)
    assert (tasks["audio_pin"]["params"]["start"], tasks["audio_pin"]["params"]["stop"]) == (
        cut.start,
        cut.stop,
    )
    assert set(tasks["join"]["inputs"]) == {"source", "window", "source_audio", "window_audio"}
    assert tasks["decode"]["inputs"]["latent"]["task"] == "r.join"
    quiet, _ = _plan(extend={"frames": 1}, audio=False)
    assert (
        not {"audio_pin", "source_audio", "audio"} & set(quiet)
        and "audio_pin" not in quiet["stage1"]["inputs"]
    )
    tiled, _ = _plan(extend={"frames": 1}, stage2_tiles="1x2", tile_overlap=1)
    assert tiled["stage2"]["kind"] == "tdp_step" and tiled["stage2.prep"]["params"]["images"] == [
        image | {"frame": 0}
    ]


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        ({"extend": {"frames": 0}}, "--extend-frames 0 must be 1..64"),
        ({"extend": {"frames": 1, "direction": "up"}}, "--direction 'up'"),
        ({"retake": {"start": 0.5, "end": 0.5}}, "is empty"),
        ({"retake": {"start": 0.1, "end": 2.0}}, "--retake: --end 2 s is past the render's 33 frames"),
        ({"retake": {"start": 0.1, "end": 0.5}, "stage2_tiles": "1x2"}, "--stage2-tiles does not apply to the retake recipe (--retake); it applies to: distilled, two-stage, dfr, extend, ic-lora, dub-it"),
        ({"retake": {"start": 0.1, "end": 0.5}, "pipeline": "two-stage"}, "--retake and --pipeline two-stage are two recipes: give one (a retake is one full-size stage, distilled or guided on dev (--pipeline one-stage): upstream's RetakePipeline has no stage 2)"),
        ({"extend": {"frames": 1}, "pipeline": "one-stage"}, "--extend and --pipeline one-stage are two recipes: give one (an extend pins the clip's boundary in two stages, half then full size: distilled or guided on dev (--pipeline two-stage); HQ's res_2s stage 2 is not built on its window)"),
        ({"extend": {"frames": 1}, "frames": 17}, "--extend: the source has 17 frames"),
        ({"extend": {"frames": 1}, "source_video": None}, "--extend names no source video"),
    ],
)
def test_clip_asks_the_farm_does_not_build_are_one_line(extra, line):
    with pytest.raises(SpecError, match=re.escape(line)):
        _plan(**extra)


def test_the_coordinators_extend_kinds_are_media_pipelines_extend_clip():
    rng = np.random.default_rng(3)
    lay = extend.ExtendLayout(33, 24.0, 2, "before")
    source, window = rng.standard_normal((1, 4, 5, 2, 3)), rng.standard_normal((1, 4, 6, 2, 3))
    src_audio, win_audio = rng.standard_normal((1, 2, 34, 4)), rng.standard_normal((1, 2, 43, 4))
    params = {"source_frames": 33, "fps": 24.0, "new_latent_frames": 2, "direction": "before"}
    inputs = {"source": source, "window": window, "source_audio": src_audio, "window_audio": win_audio}
    got = ENCODE_STEPS["extend_join"](params, inputs)
    want = media_pipelines.extend_clip(
        lay, source, src_audio, {"video_latent": window, "audio_latent": win_audio}
    )
    assert all(np.array_equal(got[k], want[k]) for k in want)
    cut = lay.source_audio_slice(34)
    pin = ENCODE_STEPS["extend_audio_pin"]({"start": cut.start, "stop": cut.stop}, {"latent": src_audio})[
        "latent"
    ]
    assert np.array_equal(pin, src_audio[:, :, cut])


def test_farm_plan_lists_the_retake_encodes(tmp_path):
    import subprocess
    import sys

    from tests.media_files import write_clip_with_audio
    from tests.unit.test_plan_cli import FLEET

    (tmp_path / "fleet.toml").write_text(FLEET)
    clip = write_clip_with_audio(tmp_path / "clip.mp4", frames=50, fps=30)  # 40 frames at the render's 24
    args = ["plan", "-p", "fox", "--fleet", str(tmp_path / "fleet.toml"), "--retake", str(clip)]
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from farm_cli.main import main; main()",
            *args,
            "--start",
            "0.2",
            "--end",
            "0.6",
        ],
        capture_output=True,
        text=True,
        timeout=50,
        env={"FARM_DATA": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "audio_encode" in result.stdout and "video_encode" in result.stdout
    assert "denoise_stage2" not in result.stdout
    assert "x33 on " in result.stdout  # no -f: the whole clip at 24 fps, rounded down to 8k + 1


@pytest.mark.parametrize("extra", [{"retake": {"start": 0.4, "end": 0.9}}, {"extend": {"frames": 1}}],
                         ids=["retake", "extend"])
def test_a_clip_stage1_asked_to_gang_carries_its_degree_table(extra):
    """`--stage1-parallel 2`: the distilled retake's and extend's pinned stage 1 gangs (the lease reads the table)."""
    stage1 = _plan(stage1_parallel="2", **extra)[0]["stage1"]
    assert stage1["params"]["stage1_parallel_request"] == "2" and stage1["params"]["stage1_degrees"] == [1] + [2] * 7


@pytest.mark.parametrize("extra", [{"retake": {"start": 0.4, "end": 0.9}, "pipeline": "one-stage"},
                                   {"extend": {"frames": 1}, "pipeline": "two-stage"}], ids=["retake-dev", "extend-dev"])
def test_a_guided_clip_stage_asked_to_gang_carries_the_table_on_each_stage1_pass(extra):
    """`--stage1-parallel 2` on the dev retake / extend: every guided stage-1 pass is a gang task (stage 2 none)."""
    tasks = _plan(stage1_parallel="2", pack="dev", stage1_steps=2, **extra)[0]
    passes = [t for name, t in tasks.items() if t["kind"] == "guidance_pass"]
    assert passes and all(name.startswith("stage1.") for name in tasks if tasks[name]["kind"] == "guidance_pass")
    assert all(t["params"]["stage1_parallel_request"] == "2" and t["params"]["stage1_degrees"] == [1] + [2] * 7
               for t in passes)
    assert all("stage1_degrees" not in t["params"] for t in tasks.values() if t["kind"] == "denoise_stage2")
