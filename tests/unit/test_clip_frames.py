"""A source clip at the render's rate and size (retake/extend, `ltx_engine.rules.clip_frames`):
render frame i is the clip's frame on screen at i / fps (upstream's timestamps; the same frames at
the same rate), held or dropped at another rate, fitted to the render's size as an `--image` is; the
worker's decode child gives exactly that for a PyAV-written clip; -f left out covers the whole clip."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from ltx_engine.rules.clip_frames import clip_length, frames_at_rate, resample_clip
from ltx_engine.rules.media import image_to_pixels

WHOLE = ((0, 64), (0, 96))


def _clip(count: int, fps: float, offset: float = 0.0) -> list[tuple[float, np.ndarray]]:
    """Frame k is the flat grey 3 k at time offset + k / fps (which frame came out reads off a pixel)."""
    return [(offset + k / fps, np.full((48, 80, 3), 3 * k, np.uint8)) for k in range(count)]


def _picked(pixels: np.ndarray) -> list[int]:
    return [round((float(pixels[0, 0, f, 0, 0]) + 1) / 2 * 255 / 3) for f in range(pixels.shape[2])]


@pytest.mark.timeout(30)
def test_frames_are_picked_by_timestamp_at_the_renders_rate():
    same = resample_clip(_clip(12, 24.0), (0, 9), (64, 96), WHOLE, 24.0, 24.0)
    assert _picked(same) == list(range(9))  # the render's own rate: upstream's frames
    faster = resample_clip(_clip(20, 30.0), (0, 9), (64, 96), WHOLE, 24.0, 30.0)
    assert _picked(faster) == [int(i * 30 / 24) for i in range(9)] == [0, 1, 2, 3, 5, 6, 7, 8, 10]  # dropped
    slower = resample_clip(_clip(6, 12.0), (2, 9), (64, 96), WHOLE, 24.0, 12.0)
    assert _picked(slower) == [1, 1, 2, 2, 3, 3, 4]  # held, from render frame 2 on
    late = resample_clip(_clip(6, 12.0, offset=0.5), (0, 4), (64, 96), WHOLE, 24.0, 12.0)
    assert _picked(late) == [0, 0, 1, 1]  # times count from the clip's first frame
    untimed = [(None, frame) for _, frame in _clip(20, 30.0)]
    assert np.array_equal(resample_clip(untimed, (0, 9), (64, 96), WHOLE, 24.0, 30.0), faster)  # k / clip fps
    assert _picked(resample_clip(_clip(20, 30.0), (3, 7), (64, 96), WHOLE, None, 30.0)) == [
        3,
        4,
        5,
        6,
    ]  # index
    ended = resample_clip(_clip(5, 24.0), (3, 8), (64, 96), WHOLE, 24.0, 24.0)
    assert _picked(ended) == [3, 4, 4, 4, 4]  # the clip ends first: its last frame repeats
    with pytest.raises(ValueError, match="no video frame"):
        resample_clip([], (0, 1), (64, 96), WHOLE, 24.0, 24.0)


@pytest.mark.timeout(30)
def test_each_picked_frame_is_fitted_to_the_render_and_cut_to_its_tile():
    rng = np.random.default_rng(3)
    frames = [(k / 30, rng.integers(0, 256, (72, 100, 3), np.uint8)) for k in range(12)]
    got = resample_clip(frames, (1, 9), (64, 96), ((32, 64), (16, 80)), 24.0, 30.0)
    want = [image_to_pixels(frames[int(i * 30 / 24)][1], 64, 96)[:, :, :, 32:64, 16:80] for i in range(1, 9)]
    assert got.shape == (1, 3, 8, 32, 64) and got.dtype == np.float32
    assert np.array_equal(got, np.concatenate(want, axis=2))


@pytest.mark.timeout(30)
def test_a_left_out_length_is_the_whole_clip_at_the_renders_rate_in_8k_plus_1():
    assert frames_at_rate(33, 24.0, 24.0) == 33 and clip_length(33, 24.0, 24.0) == 33
    assert frames_at_rate(50, 30.0, 24.0) == 40 and clip_length(50, 30.0, 24.0) == 33
    assert frames_at_rate(33, 24.0, 30.0) == 42 and clip_length(33, 24.0, 30.0) == 41
    assert clip_length(30, 24.0, 24.0) == 25 and clip_length(3, 24.0, 24.0) == 1
    assert (
        frames_at_rate(1001, 30000 / 1001, 30000 / 1001) == 1001
    )  # NTSC timestamps: no frame lost to rounding


@pytest.mark.timeout(60)
def test_the_workers_decode_child_picks_a_real_clips_frames_by_timestamp(tmp_path):
    from tests.media_files import write_clip
    from worker.media import _decode, _read, tile_pixels

    data = np.frombuffer(write_clip(tmp_path / "c30.mp4", frames=20, fps=30).read_bytes(), np.uint8)
    by_index = tile_pixels(data, [[0, 20], [0, 64], [0, 96]], 64, 96)
    args = {"pixels": [[0, 9], [0, 64], [0, 96]], "height": 64, "width": 96, "fps": 24.0}
    got = _read(_decode("video", args, data), np.load)  # the limited child, as a worker runs it
    assert np.array_equal(got, by_index[:, :, [0, 1, 2, 3, 5, 6, 7, 8, 10]])
    assert np.array_equal(tile_pixels(data, args["pixels"], 64, 96, 30.0), by_index[:, :, :9])  # its own rate


@pytest.mark.timeout(60)
def test_the_probe_resolves_a_left_out_length_from_the_clip(tmp_path):
    from coordinator.admit.media_check import check_render_media, clip_frames
    from coordinator.plan.render import normalize_spec
    from tests.media_files import write_clip_with_audio

    clip = write_clip_with_audio(tmp_path / "clip.mp4", frames=50, fps=30)
    sha = hashlib.sha256(clip.read_bytes()).hexdigest()
    spec = {"prompt": "a fox", "frame_rate": 24.0, "source_video": {"blob": sha, "name": "clip.mp4"}}
    retake = normalize_spec({**spec, "retake": {"start": 0.2, "end": 1.5}})
    assert clip_frames(retake, {sha: clip}.get) == {"frames": 33}  # 50 frames at 30 fps = 40 at 24
    assert clip_frames(normalize_spec({**spec, "extend": {"frames": 1}}), {sha: clip}.get) == {"frames": 33}
    assert clip_frames(normalize_spec({**spec, "frames": 25, "extend": {"frames": 1}}), {sha: clip}.get) == {}
    assert clip_frames(normalize_spec({"prompt": "a fox"}), {}.get) == {}  # not a clip render: no probe
    resolved = retake.resolve(frames=33)
    assert check_render_media(resolved, {sha: clip}.get) == {"source_audio": True}  # 30 fps taken at 24
