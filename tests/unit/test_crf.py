"""The H.264 CRF round trip an image takes before it is encoded (upstream's image preprocessing).

How it is matched: the reference is ltx-pipelines 1.0.0 `utils/media_io.preprocess` (with
`encode_single_frame` / `decode_single_frame`), which cannot be imported here (the package's
`__init__` imports every pipeline, and media_io needs Pillow; neither is a dependency). It needs a
codec, and the codec is the reference: PyAV's libx264. So the test holds what 1.0.0 passes it, read
back from the encoded stream itself: x264 writes its settings into the bitstream (an SEI string), where
`rc=crf crf=33.0` is the CRF and `subme=2 me=hex ref=1 rc_lookahead=10` is preset `veryfast`; one
frame, yuv420p, an mp4; the image cut to even height and width; CRF 0 returns the image untouched.
Then the worker's image_encode task on the tiny pack: the trip happens inside the task, before the
resize and the VAE, at the CRF the planner wrote.
"""

from __future__ import annotations

import io
import re

import av
import numpy as np
import pytest

from ltx_engine.crf import _encode_frame, h264_round_trip

pytestmark = pytest.mark.timeout(60)
IMAGE = (np.arange(97 * 131 * 3) % 251).astype(np.uint8).reshape(97, 131, 3)


def _x264_options(data: bytes) -> str:
    found = re.search(rb"x264 - core [^\x00]*", data)
    assert found, "no x264 settings in the stream: not libx264"
    return found.group(0).decode("ascii", "replace")


def test_the_round_trip_is_one_libx264_frame_at_the_crf_with_preset_veryfast():
    data = _encode_frame(IMAGE, 33)
    options = _x264_options(data)
    for setting in ("rc=crf", "crf=33.0", "subme=2", "me=hex", "ref=1", "rc_lookahead=10"):
        assert f" {setting} " in options, (setting, options)
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        assert container.format.name.startswith("mov,mp4")
        assert (stream.codec_context.name, stream.codec_context.pix_fmt) == ("h264", "yuv420p")
        assert (stream.codec_context.height, stream.codec_context.width) == (96, 130)  # cut to even
        assert sum(1 for _ in container.decode(video=0)) == 1
    assert " crf=18.0 " in _x264_options(_encode_frame(IMAGE, 18))


def test_the_round_trip_is_lossy_deterministic_and_crf_0_is_none():
    once, again = h264_round_trip(IMAGE, 33), h264_round_trip(IMAGE, 33)
    assert once.dtype == np.uint8 and once.shape == (96, 130, 3) and np.array_equal(once, again)
    err33 = np.abs(once.astype(int) - IMAGE[:96, :130]).mean()
    err18 = np.abs(h264_round_trip(IMAGE, 18).astype(int) - IMAGE[:96, :130]).mean()
    print(f"mean |error| after the round trip: CRF 18 {err18:.2f}, CRF 33 {err33:.2f} (of 255)")
    assert 0 < err18 < err33
    assert np.array_equal(h264_round_trip(IMAGE, 0), IMAGE)


def test_the_image_encode_task_runs_the_trip_before_the_vae(local_runner):
    params = {"pack": "tiny", "height": 64, "width": 96}
    plain, _ = local_runner.run("image_encode", {**params, "crf": 0}, {"image": IMAGE})
    tripped, _ = local_runner.run("image_encode", {**params, "crf": 33}, {"image": IMAGE})
    same, _ = local_runner.run("image_encode", {**params, "crf": 0}, {"image": h264_round_trip(IMAGE, 33)})
    default, _ = local_runner.run("image_encode", params, {"image": IMAGE})  # no crf: the pack's (2.3: 33)
    assert not np.array_equal(plain["latent"], tripped["latent"])
    assert np.array_equal(tripped["latent"], same["latent"]) and np.array_equal(default["latent"], tripped["latent"])
