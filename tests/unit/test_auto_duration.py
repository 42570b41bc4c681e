"""`--auto-duration MIN:MAX`: the range bounds the length the LTX-2.5 duration head picks
(ltx_engine/rules/duration.py's rule, upstream's seconds_to_clamped_num_frames with the range's ends), and the
planner refuses a range the head cannot honour, in one line, before anything is planned."""

from __future__ import annotations

import pytest

from coordinator.plan.graph import SpecError
from coordinator.plan.length import head_params
from coordinator.plan.render import normalize_spec, plan_render, validate_spec
from coordinator.plan.resolved import Resolved
from ltx_engine.rules.duration import MAX_SECONDS, MIN_SECONDS, frames_for, range_problem, shortest_frames
from protos.spec import RenderSpec

pytestmark = pytest.mark.timeout(60)
SPEC = {"prompt": "a fox", "pack": "tiny25", "height": 64, "width": 64, "decode_tiles": "off"}


@pytest.mark.parametrize(("low", "high"), [(1.0, 20.0), (2.0, 8.0), (3.0, 3.5), (5.0, 5.4), (1.5, 19.0)])
@pytest.mark.parametrize("fps", [24.0, 25.0, 30.0, 48.0])
def test_the_range_bounds_every_pick(low: float, high: float, fps: float) -> None:
    assert range_problem(low, high, fps) is None
    for seconds in (0.0, 0.4, low, (low + high) / 2, high, 3.3, 7.9, 12.0, 25.0, 1e3):
        frames = frames_for(seconds, fps, low, high)
        assert (frames - 1) % 8 == 0, (seconds, frames)
        assert round(low * fps) <= frames <= round(high * fps), (seconds, frames)
        inside = round(low * fps) <= round(seconds * fps) <= round(high * fps)
        if inside:  # a prediction inside the range keeps its own 8k+1 floor (or the next one up at the bottom)
            assert abs(frames - round(seconds * fps)) < 8
    assert shortest_frames(fps, low, high) == frames_for(0.0, fps, low, high)


def test_the_default_range_is_the_heads() -> None:
    assert (MIN_SECONDS, MAX_SECONDS) == (1.0, 20.0)
    assert all(frames_for(s, 24.0) == frames_for(s, 24.0, 1.0, 20.0) for s in (0.0, 2.1, 9.9, 30.0))


def test_ranges_the_head_cannot_honour_are_named() -> None:
    assert "outside the duration head's 1:20 s" in range_problem(0.5, 4.0, 24.0)
    assert "outside the duration head's 1:20 s" in range_problem(2.0, 30.0, 24.0)
    assert "holds no 8k+1 length at 24 fps (26..29 frames)" in range_problem(1.1, 1.2, 24.0)
    with pytest.raises(SpecError, match="minimum above its maximum"):
        RenderSpec.from_dict({**SPEC, "auto_duration": [8, 2]})


def _validate(**extra):
    return validate_spec(normalize_spec({**SPEC, **extra}).spec, [], Resolved(generation="2.5"))


def test_the_planner_refuses_in_one_line_and_plans_the_range_into_the_head_task() -> None:
    for extra, words in (({"auto_duration": [0.5, 4]}, "outside the duration head's"),
                         ({"auto_duration": [2, 4], "frames": 25}, "not both"),
                         ({"auto_duration": [1.1, 1.2]}, "holds no 8k\\+1 length")):
        with pytest.raises(SpecError, match=words) as info:
            _validate(**extra)
        assert "\n" not in str(info.value)
    with pytest.raises(SpecError, match="needs an LTX-2.5 pack"):
        validate_spec(normalize_spec({**SPEC, "auto_duration": [2, 4]}).spec, [], Resolved(generation="2.3"))
    plan = _validate(auto_duration=[2, 4])
    assert plan.frames is None and plan.auto_duration == (2.0, 4.0)
    head = next(t for t in plan_render(plan, "r") if t["id"] == "r.length.head")
    assert head["params"]["min_seconds"] == 2.0 and head["params"]["max_seconds"] == 4.0
    assert head_params(_validate()) == {"pack": "tiny25", "fps": 24.0}  # no range: the task as before
