"""A media decode in a child process: `python -m worker.media_child KIND ARGS_JSON SRC OUT`.

Why a child: the file is a client's (the coordinator probed it, but a crafted file may still blow up a
decoder past its header and first frame), so the worker decodes it under RLIMIT_AS / RLIMIT_CPU set
before PyAV loads, and the parent kills it past a wall limit: a bad file costs the task, not the
worker. KIND `audio`: the track's window (`ltx_engine.rules.audio_source.decode_window`) into OUT (.npz:
wave, rate); `video`: one encode tile's pixels at the render's rate and size (`worker.media.tile_pixels`) into OUT (.npy).
"""

from __future__ import annotations

import json
import math
import resource
import sys

import numpy as np


def _limit(memory_bytes: int, cpu_s: float) -> None:
    cpu = max(1, math.ceil(cpu_s))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(argv: list[str]) -> int:
    kind, args, src, out = argv[1], json.loads(argv[2]), argv[3], argv[4]
    _limit(int(args["memory_bytes"]), float(args["cpu_s"]))
    data = np.fromfile(src, dtype=np.uint8)
    if kind == "audio":
        from ltx_engine.rules.audio_source import decode_window

        wave, rate = decode_window(data, float(args["start"]), float(args["seconds"]))
        with open(out, "wb") as f:
            np.savez(f, wave=wave, rate=np.array([rate], np.int32))
        return 0
    from worker.media import tile_pixels

    with open(out, "wb") as f:
        height, width = int(args["height"]), int(args["width"])
        np.save(f, tile_pixels(data, args["pixels"], height, width, fps=args.get("fps"), hdr=args.get("hdr")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
