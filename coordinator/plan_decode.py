"""The decode end of the graph: the final video latent becomes frames (the product "video"). Pure."""

from __future__ import annotations

from coordinator.graph import expect, task


def plan_decode(rid: str, spec: dict, latent: dict) -> list[dict]:
    """One decode task of the whole latent; its frames are the render's video product."""
    return [
        task(
            rid,
            "decode",
            "decode_video",
            {
                "pack": spec["pack"],
                "product": "video",
                "expect": {"frames": expect("float32", spec["frames"], spec["height"], spec["width"], 3)},
            },
            {"latent": latent},
        )
    ]
