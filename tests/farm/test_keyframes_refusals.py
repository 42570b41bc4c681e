"""Keyframes that cannot render, through the real `farm submit` and coordinator: one line, exit 2,
nothing queued (a frame outside the clip, two replaces on one frame, an unreadable image, too many
images, a bad CRF or binding); and a client that skips the CLI is refused by the coordinator alike."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from farm_cli.client import FarmClient, FarmError
from protos.spec import MAX_IMAGES
from protos.tensors import encode_tensor
from tests.farm.test_cli_messages import JOIN, coordinator, farm, one_line  # noqa: F401 - the fixture

SPEC = ["-p", "a fox", "-H", "256", "-W", "384", "-f", "25"]


@pytest.fixture
def images(tmp_path):
    import av

    paths = []
    for k in range(2):
        path = tmp_path / f"key{k}.png"
        pixels = ((np.arange(64 * 96 * 3) + 40 * k) % 251).astype(np.uint8).reshape(64, 96, 3)
        with av.open(str(path), "w") as container:
            stream = container.add_stream("png")
            stream.width, stream.height, stream.pix_fmt = 96, 64, "rgb24"
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
            container.mux(stream.encode())
        paths.append(str(path))
    (tmp_path / "notes.png").write_text("not an image")
    return paths, str(tmp_path / "notes.png")


def _cases(first: str, second: str, text: str) -> dict[str, tuple[list[str], str]]:
    return {
        "frame past the clip": (["--image", first, "25", "1"], "image frame 25 is outside 0..24"),
        "negative frame before the clip": (["--image", first, "-26", "1"], "image frame -26 is outside 0..24"),
        "frame not a number": (["--image", first, "middle", "1"], "frame 'middle' is not an integer"),
        "two replaces on frame 0": (["--image", first, "0", "1", "--image", second, "0", "0.5",
                                     "--image-binding", "auto", "--image-binding", "replace"],
                                    "images 1 and 2 both replace latent frame 0"),
        "replace off a latent frame": (["--image", first, "5", "1", "--image-binding", "replace"],
                                       "replace needs frame 0 or 1 + 8k"),
        "unreadable image": (["--image", text, "0", "1"], f"cannot read image {text}"),
        "missing image": (["--image", first + ".gone", "0", "1"], "cannot read image"),
        "too many images": ([a for _ in range(MAX_IMAGES + 1) for a in ("--image", first, "0", "1")],
                            f"{MAX_IMAGES + 1} --image: at most {MAX_IMAGES} per render"),
        "CRF past 51": (["--image", first, "0", "1", "--image-crf", "60"], "--image-crf 60 is outside 0..51"),
        "more CRFs than images": (["--image", first, "0", "1", "--image-crf", "20", "--image-crf", "30"],
                                  "--image-crf given 2 times for 1 --image"),
        "unknown binding": (["--image", first, "0", "1", "--image-binding", "over"], "--image-binding 'over' is not one of"),
    }


@pytest.mark.timeout(300)
def test_keyframes_that_cannot_render_are_refused_at_submit(coordinator, images, store):  # noqa: F811
    (first, second), text = images
    for name, (args, line) in _cases(first, second, text).items():
        result = farm(coordinator, "submit", *SPEC, *args)
        assert result.returncode == 2, (name, result.returncode, result.stderr[-2000:])
        assert line in one_line(result), (name, result.stderr)
    assert farm(coordinator, "ls").returncode == 0
    assert not store.client.keys(f"{store.prefix}:render:*")  # nothing queued
    good = farm(coordinator, "submit", *SPEC, "--image", first, "0", "1", "--image", second, "last", "0.7")
    assert good.returncode == 0 and good.stdout.strip(), good.stderr  # the same images, framed right, queue


@pytest.mark.timeout(60)
def test_a_client_past_the_cli_is_refused_by_the_coordinator(coordinator, store):  # noqa: F811
    with FarmClient(coordinator, JOIN[coordinator], timeout=10) as client:
        blob = client.put_blob(encode_tensor(np.zeros((8, 8, 3), np.uint8)))
        base = {"prompt": "a fox", "frames": 25, "pack": "tiny"}
        for images, line in (([{"blob": blob, "frame": 0, "crf": 99}], "image 1 crf"),
                             ([{"blob": blob, "frame": 0}] * (MAX_IMAGES + 1), "at most"),
                             ([{"blob": blob, "frame": 30}], "image frame 30 is outside 0..24"),
                             ([{"blob": blob, "frame": 0}, {"blob": blob, "frame": 0}], "both replace latent frame 0"),
                             ([{"frame": 0}], "has no uploaded image")):
            with pytest.raises(FarmError, match=line) as refused:
                client.submit({**base, "images": images})
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and "\n" not in str(refused.value)
        assert client.list() == [] and not store.client.keys(f"{store.prefix}:render:*")
