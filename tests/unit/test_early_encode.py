"""The early encode (coordinator/assemble/early.py): which frames are final given the landed decode tiles
(the blend's own rule), and an mp4 streamed as tiles land that is byte for byte the all-at-once one;
a tile that changed under it, or a render that stopped, drops it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from coordinator.assemble.assembler import AUDIO_LATER, Mp4Writer, assemble_streaming
from coordinator.assemble.early import EarlyEncode, streamed_tiles
from coordinator.plan.decode import decode_tile_plan, tile_task_name
from coordinator.plan.render import normalize_spec
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.decode_tiling import FrameBlender, final_frames

BASE = {"prompt": "a fox", "height": 256, "width": 384, "frames": 49, "frame_rate": 24.0, "pack": "tiny",
        "decode_tiles": "32,256,256"}
RATE = 48000


def _spec(**kw) -> dict:
    """The render's spec as the coordinator stores it (what the early encode reads back)."""
    return normalize_spec({**BASE, **kw}).as_dict()


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.timeout(30)
def test_a_frame_is_final_once_every_tile_touching_it_landed() -> None:
    tiles = decode_tile_plan(RenderPlan.from_stored(_spec()))  # 4 temporal x 2 wide
    assert [t.pixel[0] for t in tiles[::2]] == [(0, 25), (0, 33), (8, 41), (16, 49)]
    assert final_frames(tiles, set()) == 0
    assert final_frames(tiles, {0, 1, 2}) == 0  # tile 3 (frames 0..32, the right half) is missing
    assert final_frames(tiles, {0, 1, 2, 3}) == 8  # the next tiles start at frame 8
    assert final_frames(tiles, {0, 1, 2, 3, 6, 7}) == 8  # out of order: 4 and 5 (from frame 8) still missing
    assert final_frames(tiles, {0, 1, 2, 3, 4, 5}) == 16
    assert final_frames(tiles, set(range(len(tiles)))) == 49
    blender, released = FrameBlender(tiles), 0
    rng = np.random.default_rng(0)
    for tile in tiles:  # the blend releases exactly what the rule calls final
        released += len(blender.add(tile.index, rng.uniform(-1, 1, (1, 3, *tile.pixel_shape)).astype(np.float32)))
        assert released == final_frames(tiles, range(tile.index + 1))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("count", [10, 60])  # fewer frames than x264's lookahead holds back, and more
def test_an_mp4_whose_audio_track_is_decided_last_is_the_same_bytes(tmp_path: Path, count: int) -> None:
    """The audio track decided after the frames, and the video's encode flushed before it (`end_video`:
    the early encode's tail while the audio decode runs), write the file the all-at-once writer does."""
    rng = np.random.default_rng(1)
    frames = [rng.random((64, 96, 3), dtype=np.float32) for _ in range(count)]
    wave = rng.uniform(-0.5, 0.5, (2, RATE * count // 24)).astype(np.float32)
    for name, rate in (("now", RATE), ("later", AUDIO_LATER), ("ended", AUDIO_LATER)):
        writer = Mp4Writer(tmp_path / f"{name}.mp4", width=96, height=64, fps=24, audio_rate=rate)
        for frame in frames:
            writer.write_frame(frame)
        if name == "ended":
            writer.end_video()
        if writer.audio_pending:
            writer.open_audio(RATE)
        writer.write_audio(wave, RATE)
        writer.close()
    assert _sha(tmp_path / "now.mp4") == _sha(tmp_path / "later.mp4") == _sha(tmp_path / "ended.mp4")


class Landing:
    """The render's task outputs as the early encode polls them: one more decode tile per poll, in the
    order given (the decode tiles are blobs named by their index here)."""

    def __init__(self, order: list[int]) -> None:
        self.order, self.polls, self.early, self.written = order, 0, None, []

    def __call__(self) -> dict:
        self.polls += 1
        self.written.append(self.early.written if self.early else 0)  # frames written before this poll
        return {tile_task_name(i): {"pixels": f"sha{i}"} for i in self.order[: self.polls]}


def _outputs(tiles, seed: int = 2) -> tuple[list[np.ndarray], dict]:
    rng = np.random.default_rng(seed)
    pixels = [rng.uniform(-1, 1, (1, 3, *t.pixel_shape)).astype(np.float32) for t in tiles]
    wave = rng.uniform(-0.5, 0.5, (2, RATE * 2)).astype(np.float32)
    arrays = {tile_task_name(i): {"pixels": p} for i, p in enumerate(pixels)}
    return pixels, arrays | {"audio": {"waveform": wave, "sample_rate": np.array([RATE], np.int32)}}


def _early(spec: dict, out: Path, pixels: list[np.ndarray], outputs) -> EarlyEncode:
    tiles = streamed_tiles(spec)
    return EarlyEncode(spec, tiles, out, outputs, lambda sha: pixels[int(sha.removeprefix("sha"))],
                       exr_dir=out / "exr" if spec.get("exr") else None, interval_s=0.01)


@pytest.mark.timeout(120)
def test_frames_streamed_as_tiles_land_give_the_all_at_once_mp4(tmp_path: Path) -> None:
    spec = _spec(exr="exr")
    tiles = streamed_tiles(spec)
    pixels, arrays = _outputs(tiles)
    get = lambda name, out: arrays.get(name, {}).get(out)  # noqa: E731
    whole = assemble_streaming(spec, get, tmp_path / "whole", exr_dir=tmp_path / "whole" / "exr")
    order = [6, 7, 0, 1, 2, 3, 5, 4]  # out of order: frames wait for the tiles touching them
    landing = Landing(order)
    early = landing.early = _early(spec, tmp_path / "early", pixels, landing)
    early.start()
    final = {tile_task_name(i): {"pixels": f"sha{i}"} for i in range(len(tiles))}
    streamed = early.finish(final, get, [])
    assert streamed is not None and early.written == 49
    assert landing.written[7] == 8  # before the last tile: frames 0..7 (tiles 0-3 only) were encoded
    assert _sha(streamed) == _sha(whole)
    for exr in sorted((tmp_path / "whole" / "exr").glob("frame_*.exr")):
        assert _sha(exr) == _sha(tmp_path / "early" / "exr" / exr.name)
    assert not [p for p in (tmp_path / "early").iterdir() if p.name.startswith(".")]  # nothing staged is left


@pytest.mark.timeout(120)
def test_a_tile_run_again_or_a_stopped_render_drops_the_early_encode(tmp_path: Path) -> None:
    spec = _spec()
    tiles = streamed_tiles(spec)
    pixels, arrays = _outputs(tiles)
    get = lambda name, out: arrays.get(name, {}).get(out)  # noqa: E731
    early = _early(spec, tmp_path / "rerun", pixels, Landing(list(range(len(tiles)))))
    early.start()
    final = {tile_task_name(i): {"pixels": f"sha{i}"} for i in range(len(tiles))} | {"decode.t2": {"pixels": "sha9"}}
    assert early.finish(final, get, []) is None  # blended from a blob the render no longer holds
    assert list((tmp_path / "rerun").iterdir()) == []
    stopped = _early(spec, tmp_path / "stopped", pixels, lambda: None)  # the render was cancelled
    stopped.start()
    assert stopped.finish(final, get, []) is None and stopped.written == 0
    assert list((tmp_path / "stopped").iterdir()) == []
    assert streamed_tiles(_spec(decode_tiles="off")) is None
