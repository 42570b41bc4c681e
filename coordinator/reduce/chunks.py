"""The coordinator's steps of a chunked render: a window's carried frames, and the windows' audio joined.

`chunk_carry` takes a window's last carry frames from its decode (the untiled decode's frames, or its
tiles blended in tile order as the assembler blends them), as 8-bit RGB: the frames the next window
is conditioned on, re-encoded on the workers like extend's boundary frames. `chunk_audio_join` joins the
windows' stage-1 audio latents (`ltx_engine.rules.chunks.join_audio`) for one decode of the whole track;
`chunk_latent_carry` (`--chunk-carry latent`) cuts a window's last latent frames instead.
Pure numpy, next to the blob store; `farm render --local` runs the same steps.
"""

from __future__ import annotations

import numpy as np

from coordinator.assemble.previews import to_uint8
from coordinator.plan.decode import parse_decode_tiles, tile_plan
from ltx_engine.rules.chunks import ChunkLayout, join_audio
from ltx_engine.rules.decode_tiling import blend_frames

F32 = np.float32


def _tile_frames(params: dict, inputs: dict[str, np.ndarray], first: int) -> list[np.ndarray]:
    """Frames [first, end) of a tiled decode, blended as the assembler's `tile_frames` blends them."""
    sizes = parse_decode_tiles(params["sizes"])
    tiles = tile_plan(tuple(int(x) for x in params["grid"]), sizes)  # type: ignore[arg-type]
    if len(tiles) != int(params["tiles"]):
        raise ValueError(f"decode plan has {len(tiles)} tiles, the task {params['tiles']}")
    out = []
    for index, frame in blend_frames(tiles, lambda i: inputs[f"t{i}"], 1, 3):
        if index >= first:
            out.append(np.clip((frame[0] + F32(1.0)) / F32(2.0), F32(0.0), F32(1.0)).transpose(1, 2, 0))
    return out


def chunk_carry(params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """(carry, H, W, 3) uint8: the window's last `carry` decoded frames."""
    first = int(params["frames"]) - int(params["carry"])
    if "frames" in inputs:
        frames = list(inputs["frames"][first:])
    else:
        frames = _tile_frames(params, inputs, first)
    return {"frames": np.ascontiguousarray(np.stack([to_uint8(f) for f in frames]))}


def chunk_audio_join(params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """(1, C, A, M): the windows' audio latents joined, the clip's length."""
    lay = ChunkLayout(int(params["total"]), int(params["window"]), int(params["carry"]), int(params["blend"]),
                      float(params["fps"]))
    latents = [inputs[f"w{k}"] for k in range(int(params["windows"]))]
    return {"latent": np.ascontiguousarray(join_audio(lay, latents))}


def chunk_latent_carry(params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`--chunk-carry latent`: a window's last latent frames (its stage-1 or stage-2 video latent)."""
    return {"latent": np.ascontiguousarray(inputs["latent"][:, :, -int(params["latent_frames"]) :])}


CHUNK_STEPS = {"chunk_carry": chunk_carry, "chunk_audio_join": chunk_audio_join,
               "chunk_latent_carry": chunk_latent_carry}
