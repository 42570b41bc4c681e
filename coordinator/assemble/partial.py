"""The growing film: a chunked render's finished windows, playable while the later ones still render.

Which frames are finished: window k's share of the clip ends where window k + 1's crossfade begins
(`ChunkLayout.final_frames`); its last `blend` frames change with that seam, so they join the film with
window k + 1, and the last window's share runs to the clip's end. Each decoded window's share
(`chunk_frames.window_share`, the frames the assembler will write there) is encoded once, with the
assembler's encoder, into a segment of its own, `partial/w{k}.mp4` (a segment starts on a key frame);
the segments of windows 0..k are then remuxed, packets copied without a new encode, into `partial.mp4`,
published whole (os.replace), so a fetch always reads a complete mp4 of the finished frames, and then
`partial.json` says what it holds. The segments on disk are the film's state: a coordinator that
restarts mid-render writes only the windows they lack.

Video only: the clip's track is decoded once, from every window's audio latents joined, after the last
window (an A2V track is the source's, but it is muxed with the final clip too). The final render.mp4 is
the assembler's own encode of the whole clip; the film's frames are the same frames, encoded apart.
"""

from __future__ import annotations

import json
from pathlib import Path

import av

from coordinator.assemble.assembler import Fence, Mp4Writer, OutputGetter, Staged, decoded_frames
from coordinator.assemble.chunk_frames import window_share
from coordinator.plan.chunks import chunk_layout
from coordinator.plan.resolved import RenderPlan

PARTIAL_FILE = "partial.mp4"
PARTIAL_META = "partial.json"  # {windows, frames}: what partial.mp4 holds, written after it
SEGMENTS = "partial"


def segment_path(out_dir: Path, index: int) -> Path:
    return Path(out_dir) / SEGMENTS / f"w{index}.mp4"


def film_windows(out_dir: Path) -> int:
    """How many windows, from the first, the film's segments on disk hold."""
    count = 0
    while segment_path(out_dir, count).is_file():
        count += 1
    return count


def write_segment(spec: dict, get: OutputGetter, out_dir: Path, index: int, staged: Staged) -> Path:
    """Window `index`'s share of the clip as an mp4 of its own (the assembler's encoder and settings)."""
    path = segment_path(out_dir, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    fps = float(spec.get("output_fps") or spec["frame_rate"])
    writer = Mp4Writer(staged.part(path), width=spec["width"], height=spec["height"], fps=fps, audio_rate=None)
    try:
        for frame in window_share(RenderPlan.from_stored(spec), lambda v, p: decoded_frames(v, get, p), index):
            writer.write_frame(frame)
    finally:
        writer.close()
    return staged.publish(path)


def join_segments(segments: list[Path], out: Path) -> None:
    """The segments' packets in one mp4, each segment's times shifted past the one before (by its length,
    or further when its decode-order times would not stay increasing): no frame is encoded again."""
    with av.open(str(out), mode="w", format="mp4") as container:
        stream, offset, last_dts = None, 0, None
        for path in segments:
            with av.open(str(path)) as source:
                video = source.streams.video[0]
                stream = stream or container.add_stream_from_template(video)
                packets = [p for p in source.demux(video) if p.dts is not None]
                if last_dts is not None:
                    offset = max(offset, last_dts + 1 - (packets[0].dts or 0))
                end = offset
                for packet in packets:
                    packet.pts, packet.dts = packet.pts + offset, packet.dts + offset
                    end, last_dts = max(end, packet.pts + packet.duration), packet.dts
                    packet.stream = stream
                    container.mux(packet)
                offset = end


def film_held(out_dir: Path) -> int:
    """How many windows the published partial.mp4 holds (its partial.json says), 0 before the first."""
    try:
        return int(json.loads((Path(out_dir) / PARTIAL_META).read_text())["windows"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def grow_film(spec: dict, get: OutputGetter, out_dir: Path, decoded: int, fence: Fence | None = None) -> int:
    """Bring the film up to windows [0, decoded): write the segments it lacks, then publish partial.mp4 and
    partial.json ({windows, frames}) again. Returns the windows the film holds."""
    out_dir, staged = Path(out_dir), Staged(fence)
    if decoded <= film_held(out_dir):
        return film_held(out_dir)
    for index in range(film_windows(out_dir), decoded):
        write_segment(spec, get, out_dir, index, staged)
    join_segments([segment_path(out_dir, k) for k in range(decoded)], staged.part(out_dir / PARTIAL_FILE))
    staged.publish(out_dir / PARTIAL_FILE)
    frames = chunk_layout(RenderPlan.from_stored(spec)).final_frames(decoded)
    staged.part(out_dir / PARTIAL_META).write_text(json.dumps({"windows": decoded, "frames": frames}))
    staged.publish(out_dir / PARTIAL_META)
    return decoded
