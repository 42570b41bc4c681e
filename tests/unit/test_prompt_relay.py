"""Prompt Relay (`--segment TEXT SECONDS`) in the spec, the plan and the DiT.

The spec: segments typed and refused field by field; the plan: the text task encodes the prompt with its
segments and hands a relay table to every stage task and every guidance pass but the uncond one (the
negative text task carries none), a chunked render's windows each their own, refusals in one line; the DiT:
the table's bias reaches the video's and the audio's text cross-attention, and a sequence-parallel forward
cuts it by rows, bit for bit the unsplit forward. The rule's parity with the port is tests/parity/test_prompt_relay.py.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from coordinator.plan.relay import relay_params
from coordinator.plan.render import plan_render, validate_spec
from farm_cli.render_options import spec_of_args
from ltx_engine.parallel.sequence_parallel import LocalExchange, ShardPlan, sp_forward
from ltx_engine.relay import text_mask
from ltx_engine.rules import prompt_relay as pr
from protos.fields import SpecError
from protos.relay_spec import Segment
from protos.spec import RenderSpec
from tests.unit import sp_model

pytestmark = pytest.mark.timeout(60)
BASE = {"prompt": "a fox", "frames": 49, "height": 128, "width": 128}
TWO = [{"text": "the fox sleeps", "seconds": 1.0}, {"text": "the fox runs", "seconds": 1.0}]


def _plan(raw: dict) -> list[dict]:
    return plan_render(validate_spec(RenderSpec.from_dict(raw), []), "r")


def _by_id(tasks: list[dict]) -> dict[str, dict]:
    return {t["id"].removeprefix("r."): t for t in tasks}


def test_segment_flags_become_the_field():
    spec = spec_of_args(["-p", "a fox", "--segment", "the fox sleeps", "1", "--segment", "the fox runs", "1.5",
                         "--relay-epsilon", "0.01"], "plan")
    assert spec.segments == (Segment("the fox sleeps", 1.0), Segment("the fox runs", 1.5))
    assert spec.relay_epsilon == 0.01 and spec.relay_strength is None
    assert RenderSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("raw,line", [
    ({"segments": [{"text": " ", "seconds": 1}]}, "segment 1 has no text"),
    ({"segments": [{"text": "a", "seconds": 0}]}, "segment 1 seconds 0 is outside (0.0, 600.0]"),
    ({"segments": [{"text": "a", "seconds": 1, "at": 2}]}, "segment 1 must be {text, seconds}"),
    ({"segments": [{"text": "a", "seconds": 1}] * 33}, "33 segments: at most 32"),
    ({"relay_epsilon": 1.0}, "--relay-epsilon 1.0 must be a number in (0, 1)"),
])
def test_spec_refusals(raw, line):
    with pytest.raises(SpecError) as err:
        RenderSpec.from_dict({**BASE, **raw})
    assert line in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("raw,line", [
    ({"segments": TWO + [{"text": "it rests", "seconds": 0.1}]},
     "--segment 'it rests' ends at 2.1 s, past the clip's end (49 frames at 24 fps = 2.04167 s)"),
    ({"segments": [TWO[0], {"text": "blink", "seconds": 0.1}, TWO[1]]},
     "--segment 'blink' (0.1 s from 1 s) holds no latent frame (one is 8 frames, 0.333333 s at 24 fps)"),
    ({"relay_strength": 2.0}, "--relay-strength needs one of --segment (they shape the segments' penalty)"),
    ({"segments": TWO, "temporal_upscalings": 1},
     "--segment does not apply to the dfr recipe (--dfr); it applies to: distilled, one-stage, two-stage"),
    ({"segments": TWO, "pipeline": "t2a"}, "--segment does not apply to the t2a recipe"),
])
def test_plan_refusals(raw, line):
    with pytest.raises(SpecError) as err:
        validate_spec(RenderSpec.from_dict({**BASE, **raw}), [])
    assert line in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_segments_compose_with_chunked_windows():
    """`--segment` with `--chunked` plans (windows [0, 97) and [72, 145) frames): window 0 relays both
    segments from its own text task; window 1, past them, reads the plain prompt's."""
    tasks = _by_id(_plan({**BASE, "segments": TWO, "chunked": True, "frames": 145}))
    assert tasks["w0.text"]["params"][pr.RELAY]["segments"] == [["the fox sleeps", 0.0, 1.0],
                                                                ["the fox runs", 1.0, 2.0]]
    assert tasks["w0.stage1"]["inputs"][pr.RELAY] == {"task": "r.w0.text", "output": pr.RELAY}
    assert tasks["w1.stage1"]["inputs"]["video_context"] == {"task": "r.text", "output": "video_context"}
    assert pr.RELAY not in tasks["text"]["params"] and pr.RELAY not in tasks["w1.stage1"]["inputs"]


def test_the_text_task_encodes_the_segments_and_every_stage_reads_the_table():
    tasks = _by_id(_plan({**BASE, "segments": TWO, "stage2_tiles": "2x1", "tile_overlap": 1, "relay_strength": 2.0}))
    relay = tasks["text"]["params"][pr.RELAY]
    assert relay == {"segments": [["the fox sleeps", 0.0, 1.0], ["the fox runs", 1.0, 2.0]], "fps": 24.0,
                     "epsilon": pr.DEFAULT_EPSILON, "strength": 2.0}
    assert tasks["text"]["params"]["expect"][pr.RELAY] == {"dtype": "float64", "shape": [-1, 4]}
    readers = {name for name, t in tasks.items() if t["inputs"].get(pr.RELAY) == {"task": "r.text", "output": pr.RELAY}}
    forwards = {name for name, t in tasks.items() if t["kind"] in ("denoise_stage1", "transformer_forward",
                                                                   "stage_prepare")}
    assert forwards - {"stage2.prep"} <= readers and "stage1" in readers
    assert {n for n in readers if tasks[n]["kind"] == "transformer_forward"} == {
        n for n, t in tasks.items() if t["kind"] == "transformer_forward"}
    plain = _by_id(_plan(BASE))
    assert plain["text"]["params"]["text_key"] != tasks["text"]["params"]["text_key"]
    assert pr.RELAY not in plain["text"]["params"] and not any(pr.RELAY in t["inputs"] for t in plain.values())


def test_the_uncond_pass_and_the_negative_prompt_carry_no_relay():
    tasks = _by_id(_plan({**BASE, "segments": TWO, "pipeline": "one-stage", "steps": 2, "height": 64, "width": 64,
                          "stg_blocks": [1]}))
    assert pr.RELAY not in tasks["negative"]["params"] and pr.RELAY not in tasks["negative"]["params"]["expect"]
    passes = [t for t in tasks.values() if t["kind"] == "guidance_pass"]
    assert passes and all((pr.RELAY in t["inputs"]) == (t["params"]["pass"] != "uncond") for t in passes)


def test_segments_in_a_window():
    """What a chunked render hands each window: the segments it overlaps, clipped, on its own clock."""
    spans = pr.spans([("a", 2.0), ("b", 3.0), ("c", 1.0)])
    assert pr.segments_in(spans, 1.0, 4.0) == [pr.Span("a", 0.0, 1.0), pr.Span("b", 1.0, 3.0)]
    assert pr.segments_in(spans, 5.0, 8.0) == [pr.Span("c", 0.0, 1.0)]
    assert pr.segments_in(spans, 6.0, 8.0) == []


def test_a_window_relays_the_segments_it_overlaps():
    """A chunked render's window: its text task relays the segments it overlaps on its own clock; a sliver
    holding no frame of the window is left out, and a window that overlaps none relays none."""
    spec = validate_spec(RenderSpec.from_dict({**BASE, "segments": TWO}), [])
    assert relay_params(spec, (0.9, 2.04))["segments"] == [["the fox sleeps", 0.0, pytest.approx(0.1)],
                                                         ["the fox runs", pytest.approx(0.1), pytest.approx(1.1)]]
    assert relay_params(spec, (0.0, 1.05))["segments"] == [["the fox sleeps", 0.0, 1.0]]  # runs: pixels 24..25.2
    assert relay_params(spec, (2.0, 2.04)) is None


def _relay_contexts(video, audio, strength: float = 4.0) -> dict[str, np.ndarray]:
    """Contexts of 5 text columns: the prompt 0..1, segment one 1..3, segment two 3..5."""
    table = pr.RelayTable(24.0, 1e-3, strength, ((1, 3, 0.0, 0.3), (3, 5, 0.3, 0.7))).to_array()
    return {"video_context": np.array(video.context), "audio_context": np.array(audio.context),
            "context_mask": np.ones((1, 5), np.float32), pr.RELAY: table}


def _masked(video, audio, contexts):
    video.context_mask = mx.array(text_mask(contexts, np.array(video.positions)))
    audio.context_mask = mx.array(text_mask(contexts, np.array(audio.positions), audio=True))
    return video, audio


def test_the_bias_reaches_both_text_cross_attentions():
    model = sp_model.seeded_model()
    grid = (7, 2, 2)
    plain = [np.array(x) for x in model(*sp_model.forward_inputs(grid))]
    video, audio = sp_model.forward_inputs(grid)
    contexts = _relay_contexts(video, audio)
    assert text_mask({k: v for k, v in contexts.items() if k != pr.RELAY}, np.zeros(1)) is contexts["context_mask"]
    relayed = [np.array(x) for x in model(*_masked(video, audio, contexts))]
    assert video.context_mask.shape == (1, 1, 28, 5) and audio.context_mask.shape == (1, 1, 10, 5)
    assert not np.array_equal(plain[0], relayed[0]) and not np.array_equal(plain[1], relayed[1])


@pytest.mark.parametrize("k", [2, 3])
def test_a_sequence_parallel_forward_cuts_the_bias_by_rows(k):
    """The bias has a row per query token: each shard takes its rows; the text K/V, split over the ranks and
    gathered, are whole again where the bias meets them."""
    model = sp_model.seeded_model()
    grid = (7, 3, 5)
    video, audio = _masked(*sp_model.forward_inputs(grid), _relay_contexts(*sp_model.forward_inputs(grid)))
    whole = [np.array(x) for x in model(video, audio)]
    ex = LocalExchange(ShardPlan(video.latent.shape[1], k))
    split = [np.array(x) for x in sp_forward(model, video, audio, ex)]
    assert any(what == "text_k" for what, _ in ex.log) and any(what == "audio_text_k" for what, _ in ex.log)
    np.testing.assert_array_equal(whole[0], split[0])
    np.testing.assert_array_equal(whole[1], split[1])
