"""The leader's early encodes (`assemble/early.py`): one per running render with a tiled decode, started
when its first decode tile lands and finished by the render's assembly, which otherwise assembles from
the task outputs as before. Everything the encode reads is in Redis and the blob store; its encoder is
not, so a coordinator that takes over starts over from frame 0 (correctness first)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from coordinator.assemble.assembler import OutputGetter
from coordinator.assemble.early import EarlyEncode, streamed_tiles
from coordinator.plan.decode import DECODE
from coordinator.results import as_dict
from coordinator.state.blobs import BlobStore
from protos.states import RenderState

TILE_PREFIX = f"{DECODE}.t"  # an unchunked render's decode tile tasks ("decode.t3")
STREAMING = (RenderState.RUNNING, RenderState.ASSEMBLING)


class EarlyStore(Protocol):
    """The store reads an early encode makes."""

    def get_render(self, render_id: str) -> dict | None: ...

    def render_tasks(self, render_id: str) -> list[dict]: ...


class EarlyEncodes:
    """Early encodes by render id, while this coordinator leads."""

    def __init__(self, store: EarlyStore, blobs: BlobStore, data_dir: Path, fence: Callable[[], None] | None) -> None:
        self.store, self.blobs, self.data_dir, self.fence = store, blobs, Path(data_dir), fence
        self._encodes: dict[str, EarlyEncode | None] = {}  # None: the render's frames do not stream
        self._lock = threading.Lock()

    def landed(self, render_id: str, task_id: str) -> None:
        """A task of the render committed: a decode tile starts the render's encode (or wakes it)."""
        if not task_id.removeprefix(f"{render_id}.").startswith(TILE_PREFIX):
            return
        with self._lock:
            for rid in [r for r, e in self._encodes.items() if e is not None and _dropped(e)]:
                del self._encodes[rid]  # stopped short (an error, the render stopped): a later tile restarts it
            if render_id in self._encodes:
                encode = self._encodes[render_id]
                if encode is not None:
                    encode.poke()
                return
            self._encodes[render_id] = encode = self._start(render_id)
            if encode is not None:
                encode.start()

    def _start(self, render_id: str) -> EarlyEncode | None:
        render = self.store.get_render(render_id)
        spec = as_dict(render.get("spec")) if render else {}
        tiles = streamed_tiles(spec) if spec else None
        if tiles is None:
            return None
        out_dir = self.data_dir / "renders" / render_id
        return EarlyEncode(spec, tiles, out_dir, lambda: self._outputs(render_id), self.blobs.tensor_frames,
                           preview=self.data_dir / "previews" / f"{render_id}.png",
                           exr_dir=out_dir / "exr" if spec.get("exr") else None, fence=self.fence)

    def _outputs(self, render_id: str) -> dict[str, dict[str, str]] | None:
        render = self.store.get_render(render_id)
        if render is None or render.get("state") not in STREAMING:
            return None
        prefix = f"{render_id}."
        return {str(t["id"]).removeprefix(prefix): as_dict(t.get("outputs")) for t in self.store.render_tasks(render_id)}

    def finish(self, render_id: str, outputs: dict[str, dict[str, str]], get: OutputGetter,
               runs: list[dict]) -> Path | None:
        """The render's mp4 from its early encode, None when it has none that reached the end (assemble)."""
        with self._lock:
            encode = self._encodes.pop(render_id, None)
        return None if encode is None else encode.finish(outputs, get, runs)

    def stop(self) -> None:
        """Drop every encode (this coordinator no longer leads, or stops): their part files go."""
        with self._lock:
            encodes, self._encodes = [e for e in self._encodes.values() if e is not None], {}
        for encode in encodes:
            encode.halt()
        for encode in encodes:
            encode.join(10)


def _dropped(encode: EarlyEncode) -> bool:
    return not encode.is_alive() and not encode.complete
