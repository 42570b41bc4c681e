"""A chunked render on the tiny pack through `farm render --local`: 3 windows of 17 frames carrying 9 make
one 33-frame clip whose audio lasts the clip; each later window's stage-2 latent starts with the pinned
context encoded from the window before, its stage-1 audio with the window before's last audio latents."""

from __future__ import annotations

import json

import av
import numpy as np
import pytest

from farm_cli.local import render_local

SPEC = {"prompt": "a fox", "height": 64, "width": 128, "frames": 33, "seed": 3, "pack": "tiny", "chunked": True,
        "chunk_pixel_frames": 17, "chunk_carry_frames": 9, "chunk_blend_frames": 4, "decode_tiles": "off"}


@pytest.mark.timeout(300)
def test_three_windows_join_into_one_clip_with_its_audio(local_runner, tmp_path):
    out, outputs, blobs = render_local(dict(SPEC), tmp_path / "long.mp4", local_runner)
    got = {tid.removeprefix("local."): {k: blobs.get(sha) for k, sha in o.items()} for tid, o in outputs.items()}
    assert [got[f"w{k}.decode"]["frames"].shape[0] for k in range(3)] == [17, 17, 17]
    for k in (1, 2):
        np.testing.assert_array_equal(got[f"w{k}.stage2"]["video_latent"][:, :, :2],
                                      got[f"w{k}.context_s2"]["latent"])  # 9 frames: 2 latent frames pinned
        before = got[f"w{k - 1}.stage1"]["audio_latent"]
        np.testing.assert_array_equal(got[f"w{k}.stage1"]["audio_latent"][:, :, :9], before[:, :, -9:])
    assert got["audio_join"]["latent"].shape[2] == round(33 / 24 * 25)
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["frames"] == 33 and abs(meta["audio"]["seconds"] - 33 / 24) < 1e-3
    with av.open(str(out)) as container:
        audio = container.streams.audio[0]
        assert abs(float(audio.duration * audio.time_base) - 33 / 24) <= 2 / 24
        assert sum(1 for _ in container.decode(video=0)) == 33


@pytest.mark.timeout(300)
def test_a_latent_carry_pins_the_window_befores_stage_latents(local_runner, tmp_path):
    out, outputs, blobs = render_local({**SPEC, "chunk_carry": "latent"}, tmp_path / "latent.mp4", local_runner)
    got = {tid.removeprefix("local."): {k: blobs.get(sha) for k, sha in o.items()} for tid, o in outputs.items()}
    for k in (1, 2):
        for stage in ("stage1", "stage2"):
            np.testing.assert_array_equal(got[f"w{k}.{stage}"]["video_latent"][:, :, :2],
                                          got[f"w{k - 1}.{stage}"]["video_latent"][:, :, -2:])
    assert json.loads(out.with_suffix(".json").read_text())["frames"] == 33
