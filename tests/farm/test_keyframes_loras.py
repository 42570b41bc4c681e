"""Whole case through the real CLI: two stacked seeded LoRAs (one in ComfyUI naming) and a
first (`replace`) and a last (`guide`) image, with tiled stage 2 and tiled decode: every task output on
the farm (3 workers, then 2: the LoRA tests' module farm) equals `farm render --local` bit for bit."""

from __future__ import annotations

import pytest

from farm_cli.common import read_image
from farm_cli.local import render_local
from ltx_engine.lora.lora import file_sha256
from tests.farm.test_user_loras import (  # noqa: F401 - the module farm and LoRA files, shared
    SPEC,
    STRENGTHS,
    _assert_same_outputs,
    _lora_args,
    _submit,
    lora_farm,
    loras,
)


@pytest.fixture(scope="module")
def keyframes(tmp_path_factory):
    import av
    import numpy as np

    folder, paths = tmp_path_factory.mktemp("keyframe-pngs"), []
    for k in range(2):
        pixels = ((np.arange(72 * 100 * 3) * (k + 1)) % 251).astype(np.uint8).reshape(72, 100, 3)
        path = folder / f"key{k}.png"
        with av.open(str(path), "w") as container:
            stream = container.add_stream("png")
            stream.width, stream.height, stream.pix_fmt = 100, 72, "rgb24"
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
            container.mux(stream.encode())
        paths.append(path)
    return paths


@pytest.mark.timeout(900)
def test_stacked_loras_with_a_first_and_last_image_match_local(lora_farm, loras, keyframes, local_runner,  # noqa: F811
                                                                tmp_path):
    first, last = keyframes
    images = ["--image", str(first), "0", "1", "--image", str(last), "last", "0.8",
              "--image-binding", "replace", "--image-binding", "guide"]
    render = _submit(lora_farm, *_lora_args(loras), *images)
    shas = [file_sha256(f) for f in loras]
    local_runner.loras.known.update(dict(zip(shas, loras, strict=True)))
    spec = {**SPEC, "lora_mode": render["spec"]["lora_mode"],
            "loras": [{"blob": sha, "name": f.name, "strength": s} for sha, f, s in zip(shas, loras, STRENGTHS, strict=True)],
            "images": [{"frame": 0, "strength": 1.0, "binding": "replace"},
                       {"frame": "last", "strength": 0.8, "binding": "guide"}]}
    _, outputs, _ = render_local(spec, tmp_path / "local.mp4", local_runner, [read_image(first), read_image(last)])
    _assert_same_outputs(render, {name.removeprefix("local."): out for name, out in outputs.items()})
    names = {t["id"].removeprefix(render["id"] + ".") for t in render["tasks"]}
    assert {"image1_s1", "image1_s2", "image2_s1", "image2_s2"} <= names
    assert [im["binding"] for im in render["spec"]["images"]] == ["replace", "guide"] and len(render["spec"]["loras"]) == 2
