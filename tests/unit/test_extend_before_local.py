"""`--extend CLIP --extend-frames 1 --direction before` through `farm render --local` (the farm's task
graph run in this process, what a farm render must equal bit for bit) against the engine's oracle
(`ltx_engine.media_pipelines.extend_window` + `extend_clip` from the same encoded latents).

The clip is 50 frames at 30 fps with an AAC track, rendered at 24 fps without -f: the length is the
whole clip at 24 fps rounded down to 8k + 1 (33), the source encode is the clip's frames picked by
timestamp (`ltx_engine.rules.clip_frames`) through the worker's decode child, and the new latent frame goes in
front: the joined clip is window[:1] + the source's latents, 33 + 8 frames decoded once. (A farm render
of `before` would add ~70 s to tests/farm/test_clip_farm.py, already ~160 s on this machine.)"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from farm_cli.local import render_local
from ltx_engine import media_pipelines
from ltx_engine.rules import extend
from tests.media_files import write_clip_with_audio
from worker.media import tile_pixels

# 64 pixels high: the same tasks as 128 at half the pixels for the clip's encodes, most of the compute.
H, W = 64, 192
SPEC = {"prompt": "a fox", "height": H, "width": W, "frame_rate": 24.0, "seed": 5, "pack": "tiny"}


@pytest.mark.timeout(240)
def test_extend_before_on_local_is_the_engines_extend_of_the_clip_at_the_renders_rate(local_runner, tmp_path):
    clip = write_clip_with_audio(tmp_path / "clip30.mp4", frames=50, width=W, height=H, fps=30)
    sha = hashlib.sha256(clip.read_bytes()).hexdigest()
    spec = {
        **SPEC,
        "source_video": {"blob": sha, "name": "clip30.mp4"},
        "extend": {"frames": 1, "direction": "before"},
    }
    _, outputs, blobs = render_local(spec, tmp_path / "out.mp4", local_runner, [], media={sha: clip})
    got = {
        tid.removeprefix("local."): {k: blobs.get(v) for k, v in out.items()} for tid, out in outputs.items()
    }
    engine, pack = local_runner.engine, local_runner.pack("tiny")

    data = np.frombuffer(clip.read_bytes(), np.uint8)  # the source: 33 frames at 24 fps, by timestamp
    box = [[0, 33], [0, H], [0, W]]
    pixels = tile_pixels(data, box, H, W, 24.0)
    assert not np.array_equal(pixels, tile_pixels(data, box, H, W))  # by index
    source = got["source_encode"]["latent"]
    assert source.shape[2] == 5 and np.array_equal(source, engine.encode_video_tile(pack, pixels))

    layout = extend.ExtendLayout(source_frames=33, fps=24.0, new_latent_frames=1, direction="before")
    contexts = {k: got["text"][k] for k in ("video_context", "audio_context", "context_mask")}
    render = media_pipelines.Render(
        layout.window_frames, H, W, 24.0, 5, contexts, extend.audio_latents(layout.window_frames, 24.0)
    )
    src_audio = got["source_audio"]["latent"]
    pin = src_audio[:, :, layout.source_audio_slice(src_audio.shape[2])]
    np.testing.assert_array_equal(got["audio_pin"]["latent"], pin)  # before: the clip's first audio latents
    context_half, context_full = got["context_s1"]["latent"], got["context_s2"]["latent"]
    window = media_pipelines.extend_window(engine, pack, render, layout, context_half, context_full, pin)
    np.testing.assert_array_equal(got["stage2"]["video_latent"], window["video_latent"])
    np.testing.assert_array_equal(got["stage1"]["audio_latent"], window["audio_latent"])
    np.testing.assert_array_equal(
        window["video_latent"][:, :, 1:], context_full
    )  # pinned after the new frame

    oracle = media_pipelines.extend_clip(layout, source, src_audio, window)
    joined = got["join"]
    np.testing.assert_array_equal(joined["video_latent"], oracle["video_latent"])
    np.testing.assert_array_equal(joined["audio_latent"], oracle["audio_latent"])
    np.testing.assert_array_equal(joined["video_latent"][:, :, 1:], source)  # the clip follows the new frame
    assert got["decode"]["frames"].shape[0] == 33 + 8
