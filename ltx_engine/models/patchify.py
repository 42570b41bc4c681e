"""Token positions of the LTX-2 DiT (patch size 1); the token layouts themselves are `ltx_engine.rules.tokens`.

Video tokens are ordered f, h, w (index f*H*W + h*W + w). Positions are [start, end) per axis in
pixels, time converted to seconds by fps after the causal fix (the first latent frame covers one
pixel frame). Audio positions are in seconds from the mel hop. Positions are float32 always (RoPE
angles need it).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

DEFAULT_SCALE_FACTORS = (8, 32, 32)






def video_latent_coords(batch: int, frames: int, height: int, width: int) -> np.ndarray:
    """Latent-grid [start, end) per token, (B, 3, T, 2) int, token order f, h, w."""
    f, h, w = np.meshgrid(np.arange(frames), np.arange(height), np.arange(width), indexing="ij")
    starts = np.stack([f, h, w]).reshape(3, -1)
    coords = np.stack([starts, starts + 1], axis=-1)  # patch size 1 on every axis
    return np.broadcast_to(coords, (batch, *coords.shape)).copy()


def pixel_coords(latent_coords: np.ndarray, scale_factors=DEFAULT_SCALE_FACTORS, causal_fix: bool = True):
    """Latent bounds -> pixel bounds; causal fix: time `max(t*8 + 1 - 8, 0)` so frame 0 spans [0, 1)."""
    scale = np.asarray(scale_factors).reshape(1, -1, 1, 1)
    px = latent_coords * scale
    if causal_fix:
        px[:, 0] = np.maximum(px[:, 0] + 1 - scale_factors[0], 0)
    return px


def video_positions(batch: int, frames: int, height: int, width: int, fps: float,
                    scale_factors: tuple[int, int, int] = DEFAULT_SCALE_FACTORS,
                    causal_fix: bool = True) -> mx.array:
    """(B, 3, F*H*W, 2) float32 positions: time in seconds, height/width in pixels."""
    px = pixel_coords(video_latent_coords(batch, frames, height, width), scale_factors, causal_fix)
    px = px.astype(np.float32)
    px[:, 0] = px[:, 0] / np.float32(fps)
    return mx.array(px)






def _audio_seconds(start: int, end: int, sample_rate: int, hop_length: int, downsample: int,
                   is_causal: bool) -> np.ndarray:
    mel = np.arange(start, end, dtype=np.float32) * np.float32(downsample)
    if is_causal:
        mel = np.maximum(mel + 1 - downsample, 0).astype(np.float32)
    return (mel * np.float32(hop_length) / np.float32(sample_rate)).astype(np.float32)


def audio_positions(batch: int, frames: int, sample_rate: int = 16000, hop_length: int = 160,
                    latent_downsample_factor: int = 4, is_causal: bool = True, shift: int = 0) -> mx.array:
    """(B, 1, T, 2) float32 [start, end) in seconds of each audio latent frame (reference AudioPatchifier)."""
    args = (sample_rate, hop_length, latent_downsample_factor, is_causal)
    start = _audio_seconds(shift, frames + shift, *args)
    end = _audio_seconds(shift + 1, frames + shift + 1, *args)
    pos = np.stack([start, end], axis=-1)[None, None]
    return mx.array(np.broadcast_to(pos, (batch, 1, frames, 2)).copy())


def keyframe_positions(batch: int, pixel_frame: int, height: int, width: int, fps: float,
                       num_pixel_frames: int = 1,
                       scale_factors: tuple[int, int, int] = DEFAULT_SCALE_FACTORS) -> mx.array:
    """(B, 3, H*W, 2) positions of one latent frame of keyframe tokens placed at `pixel_frame`.

    Time starts at `pixel_frame` (the causal fix only at frame 0, as the reference's keyframe
    conditioning); a latent encoding one pixel frame (`num_pixel_frames == 1`: generated slots, carried
    DFR keyframes, images) spans exactly [t, t + 1) frames, otherwise the VAE's 8 frames.
    """
    coords = video_latent_coords(batch, 1, height, width)
    px = pixel_coords(coords, scale_factors, causal_fix=pixel_frame == 0).astype(np.float32)
    px[:, 0] += np.float32(pixel_frame)
    if num_pixel_frames == 1:
        px[:, 0, :, 1] = px[:, 0, :, 0] + np.float32(1.0)
    px[:, 0] = px[:, 0] / np.float32(fps)
    return mx.array(px)
