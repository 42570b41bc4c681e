"""Prompt Relay in the plan (`--segment TEXT SECONDS`): the text task encodes the prompt with its segments and
hands the stages a relay table beside the contexts. Pure.

Why through the text task: the table needs the encoder's tokenizer (each segment's text columns), which only
a worker holds, and every stage already reads the text task's outputs, so the table reaches each forward (a
tile, a guidance pass, a shard) as one more context. The negative prompt's text task has none: the uncond
pass runs unmasked, as the port's. The rules are `ltx_engine.rules.prompt_relay`; which recipes take it is
the modifiers' table (`recipes/modifiers.py`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from coordinator.plan.graph import SpecError, expect, ref
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.prompt_relay import (
    DEFAULT_EPSILON,
    DEFAULT_STRENGTH,
    RELAY,
    RelayError,
    Span,
    check_spans,
    frame_span,
    segments_in,
    spans,
)

CLOCK_DIGITS = 12  # a window's times, rounded: windows alike get equal tables (far below a frame's 1e-9 slack)


def relay_spans(spec: RenderPlan) -> list[Span]:
    """The render's segments on the clip's clock (back to back from 0 s)."""
    return spans([(s.text, s.seconds) for s in spec.segments])


def check_relay(spec: RenderPlan) -> None:
    """Refuse segments past the clip's end or too short to hold a latent frame, in one line."""
    if not spec.segments:
        return
    try:
        check_spans(relay_spans(spec), spec.frames, spec.frame_rate)
    except RelayError as exc:
        raise SpecError(str(exc)) from None


def _window_spans(spec: RenderPlan, window: tuple[float, float]) -> list[Span]:
    """The segments a window overlaps, clipped to it, on its clock; a sliver cut by the window's edge that
    holds no latent frame of it is left out (its penalty would free it everywhere)."""
    clipped = [Span(s.text, round(s.start, CLOCK_DIGITS), round(s.end, CLOCK_DIGITS))
               for s in segments_in(relay_spans(spec), *window)]
    return [s for s in clipped if len(range(*frame_span(s.start, s.end, spec.frame_rate)))]


def relay_params(spec: RenderPlan, window: tuple[float, float] | None = None) -> dict | None:
    """The text task's relay params (None without segments): the spans, the clip's rate, the port's knobs.
    `window` [start, end) seconds: a chunked render's window, which sees the segments it overlaps on its own
    clock (None when it overlaps none)."""
    held = relay_spans(spec) if window is None else _window_spans(spec, window)
    if not held:
        return None
    epsilon = DEFAULT_EPSILON if spec.relay_epsilon is None else spec.relay_epsilon
    strength = DEFAULT_STRENGTH if spec.relay_strength is None else spec.relay_strength
    return {"segments": [[s.text, s.start, s.end] for s in held], "fps": spec.frame_rate,
            "epsilon": epsilon, "strength": strength}


def with_relay(text: dict, ctx: dict, spec: RenderPlan,
               window: tuple[float, float] | None = None) -> tuple[dict, dict]:
    """The text task with the relay params, its table expected and its cache key covering them; the stages'
    contexts with the table. Without segments (in the window) both as they are."""
    relay = relay_params(spec, window)
    if relay is None:
        return text, ctx
    params = text["params"]
    key = hashlib.sha256(json.dumps([params["text_key"], relay]).encode()).hexdigest()
    params = {**params, RELAY: relay, "text_key": key, "expect": {**params["expect"], RELAY: expect("float64", -1, 4)}}
    return {**text, "params": params}, {**ctx, RELAY: ref(text["id"], RELAY)}


def window_texts(text: dict, ctx: dict, spec: RenderPlan,
                 windows: Sequence[tuple[str, tuple[float, float]]]) -> list[tuple[dict, dict]]:
    """Each chunked window's text task and contexts; `windows`: (its task prefix, its [start, end) seconds).
    Why shared: a window's table is its own (its segments on its clock), but windows whose tables are equal
    encode one text (named after the first), and a window overlapping no segment reads the plain prompt's
    task, so no encoding runs twice."""
    shared: dict[str, tuple[dict, dict]] = {json.dumps(None): (text, ctx)}
    out = []
    for prefix, window in windows:
        key = json.dumps(relay_params(spec, window))
        if key not in shared:
            own = {**text, "id": f"{prefix}.text"}
            read = {k: ref(own["id"], r["output"]) if r.get("task") == text["id"] else r for k, r in ctx.items()}
            shared[key] = with_relay(own, read, spec, window)
        out.append(shared[key])
    return out


def without_relay(params: dict) -> dict:
    """A text task's params with no relay (the negative prompt's: its uncond pass is not masked)."""
    out = {k: v for k, v in params.items() if k != RELAY}
    if "expect" in out:
        out["expect"] = {k: v for k, v in out["expect"].items() if k != RELAY}
    return out
