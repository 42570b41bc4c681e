"""`farm bench assembly`: the coordinator's peak RSS while it blends a tiled decode, no model needed.

Synthetic decode-tile blobs of the real sizes (the default decode tiles of the given clip, float32
(1, 3, f, h, w) as workers upload them) go into a blob store on disk. Each side runs in a fresh
child process that blends every frame, converts it to uint8 as the encoder does (and encodes the mp4
with --encode), and reports its peak RSS and a sha256 over all frames:
- window: FrameBlender fed whole tiles read from their blobs (the assembly before this bench);
- frames: the assembly now (blend_frames over blob-backed tiles read a frame at a time).
Sides alternate for several pairs; the medians, spreads and the goal are printed, and the frame
hashes must agree (bit-identical output).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import typer

GOAL_BYTES = 1.5e9


def _spec(height: int, width: int, frames: int) -> dict:
    return {"height": height, "width": width, "frames": frames, "frame_rate": 24.0, "decode_tiles": "auto"}


def write_tiles(spec: dict, data: Path) -> list[str]:
    """Random decoder pixels for every decode tile, stored as blobs; their sha256s in tile order."""
    from coordinator.plan.decode import decode_tile_plan
    from coordinator.state.blobs import BlobStore
    from protos.tensors import encode_tensor

    blobs, rng = BlobStore(data), np.random.default_rng(0)
    shas = []
    for tile in decode_tile_plan(spec):
        pixels = rng.standard_normal((1, 3, *tile.pixel_shape), dtype=np.float32)
        shas.append(blobs.put_bytes(encode_tensor(pixels)))
        del pixels
    return shas


def _peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _frames(side: str, spec: dict, data: Path, shas: list[str]):
    from coordinator.assemble.assembler import tile_frames
    from coordinator.plan.decode import decode_tile_plan
    from coordinator.state.blobs import BlobStore
    from ltx_engine.rules.decode_tiling import F32, FrameBlender

    blobs, tiles = BlobStore(data), decode_tile_plan(spec)
    if side == "frames":
        yield from tile_frames(tiles, lambda i: blobs.tensor_frames(shas[i]))
        return
    blender = FrameBlender(tiles, 1, 3)
    for tile in tiles:
        for _, frame in blender.stream(tile.index, blobs.read_tensor(shas[tile.index])):
            yield np.clip((frame[0] + F32(1.0)) / F32(2.0), F32(0.0), F32(1.0)).transpose(1, 2, 0)


def child_main(side: str, spec_json: str, data: str, shas_json: str, encode: str) -> None:
    """One side in this (fresh) process: blend, convert, optionally encode; print peak RSS and hash."""
    import hashlib

    from coordinator.assemble.assembler import Mp4Writer, to_uint8

    spec, shas = json.loads(spec_json), json.loads(shas_json)
    base = _peak_rss()
    hasher, count, start = hashlib.sha256(), 0, time.perf_counter()
    writer = None
    if encode == "1":
        writer = Mp4Writer(Path(data) / f"bench-{side}.mp4", width=spec["width"], height=spec["height"],
                           fps=spec["frame_rate"], audio_rate=None)
    for frame in _frames(side, spec, Path(data), shas):
        image = to_uint8(frame)
        hasher.update(image.tobytes())
        if writer is not None:
            writer.write_frame(image)
        count += 1
    if writer is not None:
        writer.close()
    print(json.dumps({"peak": _peak_rss(), "base": base, "frames": count, "sha": hasher.hexdigest(),
                      "s": time.perf_counter() - start}), flush=True)


def _run_side(side: str, spec: dict, data: Path, shas: list[str], encode: bool) -> dict:
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    code = "import sys; from farm_cli.bench.assembly import child_main; child_main(*sys.argv[1:])"
    out = subprocess.run([sys.executable, "-c", code, side, json.dumps(spec), str(data), json.dumps(shas),
                          "1" if encode else "0"], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def assembly(height: int, width: int, frames: int, pairs: int, encode: bool, data: Path | None) -> None:
    """Print each side's peak RSS (median, spread), the ratio, the goal, and whether the frames agree."""
    from coordinator.plan.decode import decode_tile_plan
    from ltx_engine.rules.decode_tiling import blend_window, frame_bytes

    spec = _spec(height, width, frames)
    tiles = decode_tile_plan(spec)
    if tiles is None:
        raise typer.BadParameter("this clip decodes as one tile; nothing to blend")
    with tempfile.TemporaryDirectory(prefix="farm-bench-assembly-", dir=data) as tmp:
        shas = write_tiles(spec, Path(tmp))
        runs: dict[str, list[dict]] = {"window": [], "frames": []}
        for _ in range(pairs):
            for side in runs:
                runs[side].append(_run_side(side, spec, Path(tmp), shas, encode))
    tile_bytes = sum(3 * 4 * f * h * w for f, h, w in (t.pixel_shape for t in tiles))
    window = blend_window(tiles) * height * width * 4 * 4
    typer.echo(f"decode assembly {width}x{height}x{frames}: {len(tiles)} tiles, {tile_bytes / 2**30:.2f} GiB of "
               f"tile blobs, {pairs} interleaved pairs, {'with' if encode else 'without'} the mp4 encoder; "
               f"{os.cpu_count()} cores")
    typer.echo(f"held by the blend: window {window / 1e9:.2f} GB (accumulator + weights, {blend_window(tiles)} frames)"
               f" vs frames {frame_bytes(tiles) / 1e9:.3f} GB (window_bytes now printed in render.json)")
    for side, label in (("window", "before (window, whole tiles)"), ("frames", "now (frame at a time)")):
        peaks = [r["peak"] / 1e9 for r in runs[side]]
        secs = [r["s"] for r in runs[side]]
        typer.echo(f"{label:30} peak RSS {statistics.median(peaks):.2f} GB (spread {min(peaks):.2f}-{max(peaks):.2f}; "
                   f"process at start {runs[side][0]['base'] / 1e9:.2f} GB)  {statistics.median(secs):.1f} s")
    ratios = [n["peak"] / w["peak"] for n, w in zip(runs["frames"], runs["window"], strict=True)]
    now = statistics.median(r["peak"] for r in runs["frames"])
    typer.echo(f"ratio now / before {statistics.median(ratios):.3f} (spread {min(ratios):.3f}-{max(ratios):.3f}); "
               f"goal peak <= {GOAL_BYTES / 1e9:.1f} GB: {'met' if now <= GOAL_BYTES else 'NOT met'}")
    same = len({r["sha"] for side in runs.values() for r in side}) == 1
    typer.echo(f"frames bit-identical across sides and runs: {'yes' if same else 'NO'} "
               f"({runs['frames'][0]['frames']} frames, sha256 {runs['frames'][0]['sha'][:16]})")
    if not same:
        raise typer.Exit(1)
