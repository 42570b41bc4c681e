"""The coordinator's blend of a source clip's encode tiles: `video_encode_blend`.

Each `video_encode` task (one per tile of `ltx_engine.rules.encode_tiling`'s plan, on any worker) returns
its tile's latent; this recomputes the same plan from the task's params and blends the tiles in tile
order (float32, upstream's masks and normalisation), so the latent does not depend on which worker
encoded which tile. Pure numpy, next to the blob store.
"""

from __future__ import annotations

import numpy as np

from ltx_engine.rules.encode_tiling import EncodeTileSizes, blend_encoded, latent_shape, plan_encode_tiles


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


def extend_audio_pin(params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Extend: the source track's boundary latents the window pins (`ExtendLayout.source_audio_slice`)."""
    return {
        "latent": np.ascontiguousarray(inputs["latent"][:, :, int(params["start"]) : int(params["stop"])])
    }


def extend_join(params: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Extend: the window's new latents joined to the source's (`ltx_engine.rules.extend.assemble_*`)."""
    from ltx_engine.rules.extend import ExtendLayout, assemble_audio, assemble_video

    lay = ExtendLayout(
        int(params["source_frames"]),
        float(params["fps"]),
        int(params["new_latent_frames"]),
        str(params["direction"]),
    )
    out = {"video_latent": np.ascontiguousarray(assemble_video(lay, inputs["source"], inputs["window"]))}
    if "source_audio" in inputs:
        joined = assemble_audio(lay, inputs["source_audio"], inputs["window_audio"])
        out["audio_latent"] = np.ascontiguousarray(joined)
    return out


# The reducer's steps for a source clip's encode and retake/extend (named by protos.kinds' `reduce`).
ENCODE_STEPS = {"video_encode_blend": video_encode_blend, "extend_audio_pin": extend_audio_pin,
                "extend_join": extend_join}
