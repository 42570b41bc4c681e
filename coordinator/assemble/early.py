"""The early encode: a running render's frames go to the encoder as soon as they are final, so the mp4's
encode runs beside the decode instead of after its last tile.

A frame is final once every decode tile touching it has landed (`final_frames`, the blend's own release
rule): each pass reads which tiles are in, and the frames below that mark are blended (blend_frames, the
assembly's sums) and written through `VideoAssembly`, the whole assembly's writer, into one H.264 stream
with the same settings. x264 on one thread is a function of the frame sequence and its settings, so the
file is byte for byte the one the all-at-once assembly writes (a test holds the two against each other);
the audio track is decided and muxed at the end, as there. Once every frame is in, the encoder is
flushed (its tail: x264's lookahead holds ~40 frames back) without waiting for the render's last task, so
an audio decode queued behind the decode tiles runs beside it. Only a tiled, unchunked decode streams (a
chunked render grows its own film, an untiled one has nothing final before its one task).

Nothing here is resumable: the encoder's state lives in this process. A coordinator that takes over
assembles from frame 0 (or starts its own early encode at the next tile); `finish` refuses an encode
whose tiles are not the render's final ones (a task run again), and the caller assembles anew.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from coordinator.assemble.assembler import Fence, OutputGetter, VideoAssembly, tile_frames
from coordinator.plan.chunks import chunked
from coordinator.plan.decode import decode_tile_plan, tile_task_name
from coordinator.plan.recipes import recipe_for
from coordinator.plan.resolved import RenderPlan
from ltx_engine.rules.decode_tiling import DecodeTile, TileFrames, final_frames, frame_bytes

log = logging.getLogger("farm.early")
INTERVAL_S = 0.2

# The render's task outputs by name in the plan ("decode.t3" -> {"pixels": sha}), or None once the render
# stopped running (cancelled, failed: the encode is dropped).
Outputs = Callable[[], "dict[str, dict[str, str]] | None"]


def streamed_tiles(spec: dict) -> list[DecodeTile] | None:
    """The decode tiles an early encode follows, None when the render's frames do not stream."""
    plan = RenderPlan.from_stored(spec)
    if chunked(plan) or not recipe_for(plan).video:
        return None
    return decode_tile_plan(plan)


def landed(tiles: list[DecodeTile], outputs: dict[str, dict[str, str]]) -> dict[int, str]:
    """Tile index -> its pixels' blob, for the tiles whose task has landed."""
    shas = {t.index: outputs.get(tile_task_name(t.index), {}).get("pixels") for t in tiles}
    return {i: sha for i, sha in shas.items() if sha}


class EarlyEncode(threading.Thread):
    """One render's frames written as they become final, until every frame is (then `finish`)."""

    def __init__(self, spec: dict, tiles: list[DecodeTile], out_dir: Path, outputs: Outputs,
                 read: Callable[[str], TileFrames], *, preview: Path | None = None, exr_dir: Path | None = None,
                 fence: Fence | None = None, interval_s: float = INTERVAL_S) -> None:
        super().__init__(name=f"early-{Path(out_dir).name}", daemon=True)
        self.spec, self.tiles, self.outputs, self.read = spec, tiles, outputs, read
        self.out_dir, self.preview, self.exr_dir, self.fence = Path(out_dir), preview, exr_dir, fence
        self.interval_s, self.total = interval_s, final_frames(tiles, range(len(tiles)))
        self.written, self.error = 0, None
        self.read_shas: dict[int, str] = {}  # the blobs the frames were blended from
        self._landed: dict[int, str] = {}
        self._wake, self._halt, self._finishing = threading.Event(), threading.Event(), threading.Event()
        self.complete = False  # every frame written and `finish` called: the mp4 is finish's to publish
        self.assembly: VideoAssembly | None = None

    def poke(self) -> None:
        """A tile landed: look again now rather than at the next interval."""
        self._wake.set()

    def halt(self) -> None:
        self._halt.set()
        self._wake.set()

    def run(self) -> None:
        try:
            self._stream()
        except Exception as exc:  # noqa: BLE001 - the final assembly starts over from the task outputs
            log.warning("early encode of %s stopped: %s; the assembly starts over", self.out_dir.name, exc)
            self.error = exc
        if not self.complete and self.assembly is not None:
            self.assembly.abandon()

    def _stream(self) -> None:
        """Write frames as they become final; once all are written, wait for `finish` (or the render's end
        elsewhere: a render cancelled, or assembled by another leader, drops the encode and its files)."""
        self.assembly = VideoAssembly(self.spec, self.out_dir, preview=self.preview, exr_dir=self.exr_dir,
                                      fence=self.fence)
        frames = tile_frames(self.tiles, self._source)
        while not self._halt.is_set():
            outputs = self.outputs()
            if outputs is None:
                return
            self._landed = landed(self.tiles, outputs)
            for _ in range(self.written, final_frames(self.tiles, self._landed)):
                self.assembly.add(next(frames))
                self.written += 1
            if self.written == self.total:  # the encode's tail, while the render's last tasks run
                self.assembly.end_video()
            if self.written == self.total and self._finishing.is_set():
                self.complete = True
                return
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def _source(self, index: int) -> TileFrames:
        self.read_shas[index] = self._landed[index]
        return self.read(self._landed[index])

    def finish(self, final: dict[str, dict[str, str]], get: OutputGetter, runs: list[dict] | None) -> Path | None:
        """Wait for the last frames, then mux the audio and publish; None (the encode dropped) when it did
        not reach the end or read a tile other than the render's final one."""
        self._finishing.set()
        self.poke()
        self.join()
        if not self.complete or self.assembly is None or self.read_shas != landed(self.tiles, final):
            if self.assembly is not None:
                self.assembly.abandon()
            return None
        info = {"decode_tiles": len(self.tiles), "window_frames": 1, "window_bytes": frame_bytes(self.tiles)}
        return self.assembly.finish(get, runs, info)
