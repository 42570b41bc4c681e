"""The seeded tiny DiT and inputs the sequence-parallel tests and their rank processes share.

Every process builds the same model and inputs from the same seeds, so a rank needs nothing but its
rank, the hostfile and the case to run."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ltx_engine.denoise import StageInputs
from ltx_engine.models import patchify as P
from ltx_engine.models.transformer import LTXModel, Modality, TransformerConfig, tiny_config


def seeded_model(seed: int = 0, keyframes: bool = False, layout: dict | None = None) -> LTXModel:
    """The tiny pack's DiT layout with every parameter drawn from a seeded generator; `keyframes`: with
    LTX-2.5's learned keyframe embedding (what a pass's marker adds to); `layout`: keys over the tiny config's
    (another version's layout)."""
    config = TransformerConfig.from_config({"transformer": tiny_config() | (layout or {})})
    config.use_keyframes_abs_pos_embedding = keyframes
    model = LTXModel(config)
    rng = np.random.default_rng(seed)
    params = []
    for name, p in tree_flatten(model.parameters()):
        r = rng.standard_normal(p.shape).astype(np.float32)
        if name.endswith("norm.weight"):
            r = 1 + 0.1 * r
        elif p.ndim == 2 and "scale_shift_table" not in name:
            r = r / np.sqrt(p.shape[1])
        else:
            r = 0.2 * r
        params.append((name, mx.array(r)))
    model.update(tree_unflatten(params))
    return model


def forward_inputs(grid: tuple[int, int, int], audio_frames: int = 10, seed: int = 1,
                   text_rows: int = 5) -> tuple[Modality, Modality]:
    """Video of `grid` latent cells (first frame conditioned: timestep 0) and audio, both with `text_rows`
    rows of text context."""
    cfg = tiny_config()
    rng = np.random.default_rng(seed)
    f, h, w = grid
    tv = f * h * w
    ts = np.full((1, tv), 0.8, np.float32)
    ts[0, : h * w] = 0.0
    video = Modality(latent=mx.array(rng.standard_normal((1, tv, 128), np.float32)), sigma=mx.array([0.8]),
                     timesteps=mx.array(ts), positions=P.video_positions(1, f, h, w, 24.0),
                     context=mx.array(rng.standard_normal((1, text_rows, cfg["cross_attention_dim"]), np.float32)))
    audio = Modality(latent=mx.array(rng.standard_normal((1, audio_frames, 128), np.float32)),
                     sigma=mx.array([0.8]), timesteps=mx.full((1, audio_frames), 0.8),
                     positions=P.audio_positions(1, audio_frames),
                     context=mx.array(rng.standard_normal((1, text_rows, cfg["audio_cross_attention_dim"]), np.float32)))
    return video, audio


def stage1_inputs(frames: int = 17, height: int = 160, width: int = 224, seed: int = 7) -> StageInputs:
    """A stage-1 denoise of 4 steps on the tiny DiT: (3, 5, 7) = 105 latent cells, not divisible by 2 or 4."""
    cfg = tiny_config()
    rng = np.random.default_rng(seed)
    contexts = {"video_context": rng.standard_normal((1, 6, cfg["cross_attention_dim"])).astype(np.float32),
                "audio_context": rng.standard_normal((1, 6, cfg["audio_cross_attention_dim"])).astype(np.float32)}
    return StageInputs(frames=frames, height=height, width=width, fps=24.0, seed=seed,
                       sigmas=[1.0, 0.975, 0.909375, 0.725, 0.0], contexts=contexts, audio_frames=9,
                       audio_channels=8, mel_bins=16)
