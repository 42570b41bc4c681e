"""The determinism fingerprint: one fixed forward of the tiny pack's DiT on fixed inputs, hashed.

Two machines whose fingerprints agree computed that forward to the same bits: same kernels, same
reduction orders, same library versions where it matters. The farm deals the tiles of one step and
the ranks of one gang to workers of one fingerprint (one class), so a render's bits depend only on
its spec and the classes it ran on. It runs on the worker's default device (Metal on a Mac, the CPU
elsewhere), the device its tasks run on, and takes well under a second (a 2-layer DiT, 58 tokens).
"""

from __future__ import annotations

import hashlib
from functools import cache

import mlx.core as mx
import numpy as np

from ltx_engine.models import patchify as P
from ltx_engine.models.transformer import Modality

GRID = (2, 4, 6)  # latent frames, height, width of the fixed video input
AUDIO_FRAMES, TEXT_TOKENS, INPUT_SEED = 10, 5, 7
CHARS = 12


def _inputs(cfg: dict) -> tuple[Modality, Modality]:
    """Fixed inputs drawn from one seeded generator (numpy's, identical on every machine)."""
    rng = np.random.default_rng(INPUT_SEED)
    f, h, w = GRID
    tokens = f * h * w
    video = Modality(latent=mx.array(rng.standard_normal((1, tokens, cfg["in_channels"]), np.float32)),
                     sigma=mx.array([0.8]), timesteps=mx.full((1, tokens), 0.8),
                     positions=P.video_positions(1, f, h, w, 24.0),
                     context=mx.array(rng.standard_normal((1, TEXT_TOKENS, cfg["cross_attention_dim"]), np.float32)))
    audio = Modality(latent=mx.array(rng.standard_normal((1, AUDIO_FRAMES, cfg["audio_in_channels"]), np.float32)),
                     sigma=mx.array([0.8]), timesteps=mx.full((1, AUDIO_FRAMES), 0.8),
                     positions=P.audio_positions(1, AUDIO_FRAMES),
                     context=mx.array(rng.standard_normal((1, TEXT_TOKENS, cfg["audio_cross_attention_dim"]),
                                                          np.float32)))
    return video, audio


@cache
def forward_fingerprint() -> str:
    """sha256 prefix of the tiny DiT's video and audio velocities on the fixed inputs (computed once)."""
    from ltx_engine.tiny.tiny_pack import tiny_dit, tiny_embedded_config

    model = tiny_dit()
    video, audio = _inputs(tiny_embedded_config()["transformer"])
    v, a = model(video, audio)
    mx.eval(v, a)
    digest = hashlib.sha256(np.array(v.astype(mx.float32)).tobytes())
    digest.update(np.array(a.astype(mx.float32)).tobytes())
    return digest.hexdigest()[:CHARS]
