"""A chunked render's frames: its decoded windows joined into one clip, streamed in order.

Window k's frames before the last `blend` frames of its overlap with window k + 1 are the clip's; those
`blend` frames are crossfaded into window k + 1's (`ltx_engine.rules.chunks.crossfade`), whose frames
then follow. Only the `blend` frames of one seam are held, so the join streams like one window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice

import numpy as np

from coordinator.plan.chunks import chunk_layout, window_view
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.chunks import ChunkLayout, Window, crossfade

Frames = Callable[[RenderPlan, str], tuple[Iterator[np.ndarray], dict]]  # (window view, task prefix) -> frames


def joined_frames(plan: RenderPlan, window_frames: Frames) -> tuple[Iterator[np.ndarray], dict]:
    """The clip's frames in order, and what the metadata says of the decode: the first window's (filled in
    as it is read, before the assembler reads it once the frames are written) and the number of windows."""
    lay = chunk_layout(plan)
    info = {"chunk_windows": len(lay.windows)}
    return _join(plan, lay, window_frames, info), info


def _join(plan: RenderPlan, lay: ChunkLayout, window_frames: Frames, info: dict) -> Iterator[np.ndarray]:
    held: list[np.ndarray] = []
    for window in lay.windows:
        frames, decoded = window_frames(window_view(plan, window), f"w{window.index}.")
        if window.index == 0:
            info.update(decoded)
        held = yield from _window(lay, window, frames, held)


def window_share(plan: RenderPlan, window_frames: Frames, index: int) -> Iterator[np.ndarray]:
    """Window `index`'s share of the clip alone, as `joined_frames` yields it: its frames from its seam
    with the window before (crossfaded with that window's held frames, read again here) to its own held
    tail. The growing film (`assemble/partial.py`) writes one share per decoded window."""
    lay = chunk_layout(plan)
    window, held = lay.windows[index], []
    if index:
        before = lay.windows[index - 1]
        frames, _ = window_frames(window_view(plan, before), f"w{before.index}.")
        held = list(islice(frames, before.frames - lay.blend, None))
    frames, _ = window_frames(window_view(plan, window), f"w{index}.")
    yield from _window(lay, window, frames, held)


def _window(lay: ChunkLayout, window: Window, frames: Iterator[np.ndarray],
            held: list[np.ndarray]) -> Iterator[np.ndarray]:
    """One window's share of the clip; returns its last `blend` frames, held for the next seam."""
    lead = window.carry - lay.blend  # frames the window before already gave
    last = window.index == len(lay.windows) - 1
    kept: list[np.ndarray] = []
    for j, frame in enumerate(frames):
        if window.index and j < lead:
            continue
        if window.index and j < window.carry:
            yield crossfade(held[j - lead], frame, j - lead, lay.blend)
        elif not last and j >= window.frames - lay.blend:
            kept.append(frame)
        else:
            yield frame
    return kept
