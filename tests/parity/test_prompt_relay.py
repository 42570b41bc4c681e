"""Prompt Relay's rule against the MLX port's formulas, written out in this test.

The port (dgrauet/ltx-2-mlx, `ltx_core_mlx/conditioning/prompt_relay.py`, after WhatDreamsCost / Kijai's
ComfyUI node) is not installed here, so `_port_mask`, `_port_lengths` and `_port_ranges` below restate its
`build_relay_mask`, `distribute_segment_lengths` and `map_token_ranges` as it computes them: float32 numpy,
query frame = row // tokens per frame, rows past F * tokens per frame (appended keyframe tokens) free,
midpoint (2 cursor + length) // 2, plateau max(length // 2 - 2, 0), sigma = 1 / ln(1 / epsilon), penalty
strength * max(|f - mid| - plateau, 0)^2 / (2 sigma^2) on the segment's columns, the mask its negative.
Our rule reads each token's frame from its positions and each segment's frames from its seconds; on a
stage's own tokens the bias equals the port's mask to the bit (the port then casts it to bfloat16, as our
attention casts it to the query's dtype).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ltx_engine.models import patchify
from ltx_engine.rules import prompt_relay as pr
from ltx_engine.tiny.tiny_tokenizer import build_tiny_tokenizer

pytestmark = pytest.mark.timeout(60)
FPS = 24.0


def _port_lengths(count: int, latent_frames: int, pinned: list[int | None] | None) -> list[int]:
    """The port's distribute_segment_lengths: pinned lengths kept, the rest a ceil split, clamped to F."""
    if pinned is None:
        lengths = [-(-latent_frames // count)] * count
    else:
        auto = [i for i, n in enumerate(pinned) if n is None]
        left = max(latent_frames - sum(n for n in pinned if n is not None), 0)
        share = -(-left // len(auto)) if auto and left > 0 else 0
        lengths = [share if n is None else n for n in pinned]
    out, cursor = [], 0
    for n in lengths:
        end = min(cursor + n, latent_frames)
        out.append(max(end - cursor, 0))
        cursor = end
    return out


def _port_mask(ranges, lengths, nv, per_frame, latent_frames, nk, epsilon=1e-3, strength=1.0) -> np.ndarray:
    """The port's build_relay_mask before its bfloat16 cast: (Nv, Nk) float32."""
    if not 0.0 < epsilon < 1.0 or any(n <= 0 for n in lengths) or any(b > nk for _, b in ranges):
        raise ValueError("refused")
    sigma = 1.0 / math.log(1.0 / epsilon)
    cost = np.zeros((nv, nk), dtype=np.float32)
    rows = np.arange(nv)
    frames = (rows // per_frame).astype(np.float32)
    real = rows < latent_frames * per_frame
    inverse = 1.0 / (2.0 * sigma * sigma)
    cursor = 0
    for (a, b), n in zip(ranges, lengths, strict=True):
        mid, plateau = float((2 * cursor + n) // 2), max(n // 2 - 2, 0)
        penalty = strength * np.square(np.maximum(np.abs(frames - mid) - plateau, 0.0)) * inverse
        cost[:, a:b] = np.where(real, penalty, 0.0).astype(np.float32)[:, None]
        cursor += n
    return -cost


def _port_ranges(encode, prompt: str, texts: list[str]) -> list[tuple[int, int]]:
    """The port's map_token_ranges: lengths of the growing prefixes, each local after a space."""
    before, built, out = len(encode(prompt.strip())), prompt, []
    for t in texts:
        built += " " + t
        now = len(encode(built.strip()))
        out.append((before, now))
        before = now
    return out


def _seconds_for(lengths: list[int]) -> list[float]:
    """Durations whose spans hold exactly these latent frames: each boundary half-way between the centre
    pixels of the frames either side (frame f >= 1 centres at pixel 8f - 3.5, frame 0 at 0)."""
    bounds, cursor = [0.0], 0
    for n in lengths:
        cursor += n
        bounds.append((8 * cursor - 7.5) / FPS)
    return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]


def _positions(f: int, h: int, w: int, guides: tuple[int, ...] = ()) -> np.ndarray:
    """A stage's video positions, then one frame of guide tokens per pixel frame in `guides` (appended)."""
    parts = [np.array(patchify.video_positions(1, f, h, w, FPS), np.float32)]
    parts += [np.array(patchify.keyframe_positions(1, p, h, w, FPS), np.float32) for p in guides]
    return np.concatenate(parts, axis=2)


def _ours(lengths, ranges, grid, nk, guides=(), epsilon=1e-3, strength=1.0) -> np.ndarray:
    spans = pr.spans(list(zip([f"s{i}" for i in range(len(lengths))], _seconds_for(lengths), strict=True)))
    table = pr.RelayTable(FPS, epsilon, strength, tuple((a, b, s.start, s.end) for (a, b), s in
                                                       zip(ranges, spans, strict=True)))
    table = pr.RelayTable.from_array(table.to_array())  # as the text task hands it on
    return pr.relay_bias(pr.video_frames(_positions(*grid, guides), FPS), table, nk)


CASES = [  # latent lengths, columns, grid (F, h, w), guides at pixel frames, epsilon, strength
    ([3, 4], [(5, 8), (8, 10)], (7, 2, 3), (), 1e-3, 1.0),
    ([2, 2, 3], [(3, 5), (5, 9), (9, 10)], (7, 1, 2), (20,), 1e-3, 1.0),
    ([5, 6], [(4, 6), (6, 7)], (11, 2, 2), (12, 80), 0.05, 2.5),
    ([1, 9, 1], [(2, 3), (3, 6), (6, 8)], (11, 3, 1), (), 1e-4, 0.5),
    ([2, 3], [(3, 4), (4, 6)], (7, 2, 2), (), 1e-3, 1.0),  # the clip's last two frames in no segment
]


@pytest.mark.parametrize("lengths,ranges,grid,guides,epsilon,strength", CASES)
def test_bias_is_the_ports_mask_to_the_bit(lengths, ranges, grid, guides, epsilon, strength):
    f, h, w = grid
    nk = 16
    ours = _ours(lengths, ranges, grid, nk, guides, epsilon, strength)
    port = _port_mask(ranges, _port_lengths(len(lengths), f, lengths), f * h * w + len(guides) * h * w, h * w, f,
                      nk, epsilon, strength)
    assert ours.dtype == np.float32 and ours.shape == port.shape
    np.testing.assert_array_equal(ours, port)
    assert (ours[:, : ranges[0][0]] == 0).all() and (ours[:, ranges[-1][1]:] == 0).all()  # prompt, registers free
    assert (ours[f * h * w:] == 0).all()  # guides free, as the port's appended rows
    assert (ours < 0).any()


def test_seconds_to_frames_match_the_ports_pinned_lengths():
    """Covering durations give the port's lengths (its pinned beats, clamped to the clip); the last segment
    may run to the clip's end exactly."""
    for f in (2, 7, 16, 31):
        frames = 8 * (f - 1) + 1
        for lengths in ([f], [1, f - 1], [f // 2, f - f // 2]):
            if 0 in lengths:
                continue
            spans = pr.spans([("x", s) for s in _seconds_for(lengths)])
            spans[-1] = pr.Span("x", spans[-1].start, frames / FPS)  # to the clip's end exactly
            got = [b - a for a, b in (pr.frame_span(s.start, s.end, FPS) for s in spans)]
            assert got == _port_lengths(len(lengths), f, lengths) == lengths
            pr.check_spans(spans, frames, FPS)


def test_token_ranges_are_the_ports_incremental_count():
    tok = build_tiny_tokenizer()

    def encode(text: str) -> list[int]:
        return tok.encode(text).ids

    prompt, texts = "a cat sits on a red chair, cinematic", ["the cat looks up", "it jumps; slowly!", "sunset"]
    ours = pr.token_ranges(lambda t: len(encode(t.strip())), prompt, texts)
    assert ours == _port_ranges(encode, prompt, texts)
    assert ours[0][0] == len(encode(prompt)) and ours[-1][1] == len(encode(pr.combined_prompt(prompt, texts)))
    assert pr.combined_prompt(prompt, texts) == prompt + " " + " ".join(texts)  # the port's combined prompt


@pytest.mark.parametrize("epsilon", [0.0, 1.0, -0.5, 2.0])
def test_epsilon_outside_zero_one_is_refused(epsilon):
    """The port refuses epsilon 1 (no falloff) rather than default it: so do we."""
    table = pr.RelayTable(FPS, epsilon, 1.0, ((2, 3, 0.0, 1.0),))
    with pytest.raises(pr.RelayError, match="outside"):
        pr.relay_bias(np.zeros(4), table, 8)
    with pytest.raises(ValueError):
        _port_mask([(2, 3)], [2], 4, 1, 4, 8, epsilon)


def test_a_segment_without_a_frame_and_columns_past_the_text_are_refused():
    """The port's zero-length beat (it would attend everywhere) and its range past the text axis."""
    with pytest.raises(pr.RelayError, match="no latent frame"):
        pr.check_spans([pr.Span("blink", 1.0, 1.1)], 49, FPS)  # pixels 24..26.4: no frame's centre inside
    with pytest.raises(pr.RelayError, match="past the clip's end"):
        pr.check_spans(pr.spans([("a", 1.0), ("b", 1.1)]), 49, FPS)
    with pytest.raises(pr.RelayError, match="past the text"):
        pr.relay_bias(np.zeros(4), pr.RelayTable(FPS, 1e-3, 1.0, ((20, 30, 0.0, 1.0),)), 16)
    with pytest.raises(ValueError):
        _port_mask([(2, 3), (3, 4)], _port_lengths(2, 5, [5, None]), 5, 1, 5, 8)


def test_audio_tokens_sit_on_the_video_frame_clock():
    """Our addition (the port gates video only): an audio token at a latent frame's centre time is at that
    frame, between frames in between; its penalty follows the same curve."""
    pos = np.array(patchify.audio_positions(1, 100), np.float32)
    coords = pr.audio_frames(pos, FPS)
    assert np.all(np.diff(coords) > 0)
    mid = (pos[0, 0, :, 0] + pos[0, 0, :, 1]) / 2 * FPS
    np.testing.assert_allclose(coords, (mid + 3.5) / 8, rtol=1e-6)
    video = pr.video_frames(_positions(7, 1, 1), FPS)
    assert video.tolist() == list(range(7))
