"""blend_frames (the coordinator's frame-at-a-time decode blend) against FrameBlender (the windowed
blender it replaces in assembly): bit-identical frames, from in-memory tiles and from blob files read a
frame at a time."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.state.blobs import BlobStore, TensorFrames
from ltx_engine.rules.decode_tiling import DecodeTileSizes, FrameBlender, blend_frames, plan_decode_tiles
from protos.tensors import encode_tensor

pytestmark = pytest.mark.timeout(120)


SIZES = DecodeTileSizes(24, 8, 96, 32)  # small tiles that still cut time, height and width


def _tiles_and_pixels(latent=(1, 8, 13, 6, 9), dtype=np.float32):
    tiles = plan_decode_tiles(latent, SIZES)
    rng = np.random.default_rng(3)
    pixels = [rng.uniform(-1.2, 1.2, (1, 3, *t.pixel_shape)).astype(dtype) for t in tiles]
    return tiles, pixels


def _windowed(tiles, pixels) -> list[np.ndarray]:
    blender = FrameBlender(tiles, 1, 3)
    frames = []
    for i in (2, 0, 1, *range(3, len(tiles))):  # arrival order does not matter to either
        frames += [frame.copy() for _, frame in blender.stream(i, pixels[i])]
    assert blender.done
    return frames


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_frame_at_a_time_equals_the_windowed_blender_bit_for_bit(dtype) -> None:
    tiles, pixels = _tiles_and_pixels(dtype=dtype)
    assert len({t.pixel[0] for t in tiles}) > 1 and len({t.pixel[1] for t in tiles}) > 1  # tiled in t, h, w
    want = _windowed(tiles, pixels)
    got = [frame for _, frame in blend_frames(tiles, lambda i: pixels[i])]
    assert len(got) == len(want) == max(t.pixel[0][1] for t in tiles)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype == np.float32 and a.tobytes() == b.tobytes()


def test_tiles_read_from_blob_files_a_frame_at_a_time_give_the_same_frames(tmp_path) -> None:
    tiles, pixels = _tiles_and_pixels()
    blobs = BlobStore(tmp_path)
    readers = [blobs.tensor_frames(blobs.put_bytes(encode_tensor(p))) for p in pixels]
    assert all(isinstance(r, TensorFrames) for r in readers)
    np.testing.assert_array_equal(readers[1][:, :, 5], pixels[1][:, :, 5])
    want = _windowed(tiles, pixels)
    for (_, a), b in zip(blend_frames(tiles, lambda i: readers[i]), want, strict=True):
        assert a.tobytes() == b.tobytes()
    with pytest.raises(TypeError):
        readers[0][0]
    with pytest.raises(IndexError):
        readers[0][:, :, tiles[0].pixel_shape[0]]


def test_a_missing_or_misshapen_tile_is_refused() -> None:
    tiles, pixels = _tiles_and_pixels()
    with pytest.raises(RuntimeError, match="no pixels"):
        list(blend_frames(tiles, lambda i: None))
    with pytest.raises(ValueError, match="expected"):
        list(blend_frames(tiles, lambda i: pixels[i][:, :, :-1]))
