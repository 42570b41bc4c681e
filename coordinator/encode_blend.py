"""The coordinator's blend of a source clip's encode tiles (issue #24): `video_encode_blend`.

Each `video_encode` task (one per tile of `ltx_engine.encode_tiling`'s plan, on any worker) returns
its tile's latent; this recomputes the same plan from the task's params and blends the tiles in tile
order (float32, upstream's masks and normalisation), so the latent does not depend on which worker
encoded which tile. Pure numpy, next to the blob store.
"""

from __future__ import annotations

import numpy as np

from ltx_engine.encode_tiling import EncodeTileSizes, blend_encoded, latent_shape, plan_encode_tiles


def video_encode_blend(params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    frames, height, width = int(params["frames"]), int(params["height"]), int(params["width"])
    t, t_overlap, s, s_overlap = params["sizes"]
    sizes = EncodeTileSizes(
        frames=t, frames_overlap=int(t_overlap), spatial=s, spatial_overlap=int(s_overlap)
    )
    tiles = plan_encode_tiles(frames, height, width, sizes)
    if len(tiles) != int(params["tiles"]):
        raise ValueError(f"encode plan has {len(tiles)} tiles, the task {params['tiles']}")
    latents = [inputs[f"t{i}"] for i in range(len(tiles))]
    shape = (latents[0].shape[0], latents[0].shape[1], *latent_shape(frames, height, width))
    return {"latent": np.ascontiguousarray(blend_encoded(shape, zip(tiles, latents, strict=True)))}


ENCODE_KINDS = {"video_encode_blend": video_encode_blend}
