"""IC-LoRA control: a control video's latent as reference tokens of stage 1, with its attention strength.

As upstream 1.0.0 (`ICLoraPipeline._create_conditionings`, ltx-core `VideoConditionByReferenceLatent`
wrapped in `ConditioningItemAttentionStrengthWrapper`, `mask_utils.build_attention_mask`):
- the control clip is encoded at the stage's size over the LoRA's `reference_downscale_factor`
  (`control_size`; both sides must divide), its tokens appended after every other token with latent =
  clean = the reference, denoise mask 1 - strength, positions of its own grid (causal fix, seconds at
  the stage's fps) with height and width scaled by the factor into the target's pixels;
- an attention strength below 1 builds the (1, N+M, N+M) self-attention mask: 1 among the N existing
  tokens (generated + guides) and among the M reference tokens, the strength between the generated
  tokens and the reference (both ways), 0 between earlier conditioning tokens and the reference. At
  strength 1 there is no mask (full attention), as upstream passes none. The DiT reads the mask as the
  additive bias log(m) (`models.transformer._self_attention_bias`, upstream `_prepare_self_attention_mask`);
- stage 2 runs on the plain DiT with no reference (the farm's warm distilled DiT, TDP-tileable), or, as
  the MLX port's control-aware refine, with the IC-LoRA and the reference encoded at its own size;
- a mask clip (upstream 1.2.0's `--conditioning-attention-mask`, `iclora_utils.downsample_mask_video_to_latent`)
  gives per-token strengths (`mask_from_pixels`, `latent_mask`) times the attention strength.
Pure numpy (the coordinator may check control sizes and LoRA metadata at submit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ltx_engine.rules.sampling import LatentState
from ltx_engine.rules.tokens import patchify_video

F32 = np.float32


class ControlError(ValueError):
    """A control reference the stage cannot take (one line)."""


@dataclass(frozen=True)
class ControlReference:
    """A control (or Dub-It reference) video's latent (1, C, F, h, w) and how it conditions the stage."""

    latent: np.ndarray
    strength: float = 1.0  # 1: the reference stays clean (mask 0)
    attention_strength: float = 1.0  # upstream's conditioning_attention_strength, in [0, 1]
    downscale: int = 1  # the LoRA's reference_downscale_factor
    attention_mask: np.ndarray | None = None  # (1, M) per-token [0, 1] from a mask video (`latent_mask`)

    def __post_init__(self) -> None:
        if not 0.0 <= self.attention_strength <= 1.0:
            raise ControlError(f"attention strength {self.attention_strength} must be in [0, 1]")
        if self.downscale < 1:
            raise ControlError(f"reference downscale {self.downscale} must be >= 1")
        if self.attention_mask is not None and np.shape(self.attention_mask) != (1, self.tokens):
            raise ControlError(
                f"attention mask {np.shape(self.attention_mask)} != (1, {self.tokens}) reference tokens"
            )

    def cross(self) -> float | np.ndarray | None:
        """The reference's attention strengths as upstream picks them: mask x strength when a mask video is
        given, the scalar below 1, else None (no mask at all)."""
        if self.attention_mask is not None:
            return (np.asarray(self.attention_mask, F32) * F32(self.attention_strength)).astype(F32)
        return self.attention_strength if self.attention_strength < 1.0 else None

    @property
    def tokens(self) -> int:
        return int(np.prod(np.shape(self.latent)[2:]))


def control_size(height: int, width: int, downscale: int) -> tuple[int, int]:
    """(height, width) in pixels the control clip is resized to and encoded at, for a stage of that size."""
    if height % downscale or width % downscale:
        raise ControlError(
            f"the stage's {height}x{width} must be divisible by the IC-LoRA's reference "
            f"downscale factor {downscale}"
        )
    return height // downscale, width // downscale


def reference_positions(grid: tuple[int, int, int], fps: float, downscale: int) -> np.ndarray:
    """(1, 3, F*h*w, 2) float32 positions of reference tokens (token order f, h, w): time in seconds after
    the causal fix, height/width in pixels (32 per latent) scaled by the downscale into the target's."""
    f, h, w = grid
    ff, hh, ww = (
        a.reshape(-1).astype(F32)
        for a in np.meshgrid(np.arange(f), np.arange(h), np.arange(w), indexing="ij")
    )
    t0, t1 = np.maximum(ff * 8 + 1 - 8, 0), np.maximum((ff + 1) * 8 + 1 - 8, 0)
    axes = [
        np.stack([t0, t1], -1) / F32(fps),
        np.stack([hh, hh + 1], -1) * 32,
        np.stack([ww, ww + 1], -1) * 32,
    ]
    px = np.stack(axes)[None].astype(F32)
    if downscale != 1:
        px[:, 1:] *= F32(downscale)
    return px


def mask_from_pixels(pixels: np.ndarray) -> np.ndarray:
    """A mask video's (1, 3, F, H, W) pixels in [-1, 1] -> (1, 1, F, H, W) in [0, 1] (channel mean), as
    upstream's `_load_mask_video` (the clip resized to the stage's size as any control clip)."""
    return np.clip((np.asarray(pixels, F32).mean(axis=1, keepdims=True) + F32(1.0)) / F32(2.0), 0.0, 1.0)


def _area(x: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Adaptive average pooling along one axis (torch's `interpolate(mode="area")`)."""
    n = x.shape[axis]
    parts = [
        np.take(x, range((i * n) // size, -((-(i + 1) * n) // size)), axis=axis).mean(
            axis=axis, keepdims=True
        )
        for i in range(size)
    ]
    return np.concatenate(parts, axis=axis).astype(F32)


def latent_mask(mask: np.ndarray, grid: tuple[int, int, int]) -> np.ndarray:
    """(1, 1, F, H, W) pixel mask -> (1, f*h*w) per reference token (upstream 1.0.0's
    `_downsample_mask_to_latent`, 1.2.0's `iclora_utils.downsample_mask_video_to_latent`, the same math):
    area-pooled to the latent's h x w, then the first frame alone and each later group of
    (F - 1) / (f - 1) frames averaged."""
    f, h, w = grid
    m = _area(_area(np.asarray(mask, F32), h, 3), w, 4)
    f_pix = m.shape[2]
    if f_pix > 1 and f > 1:
        if (f_pix - 1) % (f - 1):
            raise ControlError(
                f"a mask of {f_pix} frames does not fit {f} latent frames ((F - 1) % (f - 1) != 0)"
            )
        t = (f_pix - 1) // (f - 1)
        rest = m[:, :, 1:].reshape(1, 1, f - 1, t, h, w).mean(axis=3)
        m = np.concatenate([m[:, :, :1], rest], axis=2)
    else:
        m = m[:, :, :1]
    return m.reshape(1, -1).astype(F32)


def build_attention_mask(
    existing: np.ndarray | None, num_noisy: int, num_existing: int, cross: np.ndarray
) -> np.ndarray:
    """(B, N+M, N+M) mask for M new reference tokens after N existing ones (upstream's block layout)."""
    batch, num_new = cross.shape
    total = num_existing + num_new
    mask = np.zeros((batch, total, total), F32)
    mask[:, :num_existing, :num_existing] = 1.0 if existing is None else existing
    mask[:, num_existing:, num_existing:] = 1.0
    mask[:, :num_noisy, num_existing:] = cross[:, None, :]
    mask[:, num_existing:, :num_noisy] = cross[:, :, None]
    return mask


def update_attention_mask(
    existing: np.ndarray | None,
    strength: float | np.ndarray | None,
    num_noisy: int,
    num_existing: int,
    num_new: int,
) -> np.ndarray | None:
    """The state's mask after appending `num_new` tokens: None stays None when no strength is asked;
    an existing mask grows with full attention (1) for tokens appended without a strength."""
    if strength is None:
        if existing is None:
            return None
        strength = 1.0
    cross = np.broadcast_to(np.asarray(strength, F32), (1, num_new)).astype(F32)
    return build_attention_mask(existing, num_noisy, num_existing, cross)


def append_control(
    video: LatentState, attention: np.ndarray | None, ref: ControlReference, fps: float, num_noisy: int
) -> tuple[LatentState, np.ndarray | None]:
    """`video` with the reference tokens appended last, and the self-attention mask after it."""
    latent = np.asarray(ref.latent, F32)
    tokens = patchify_video(latent)
    positions = reference_positions(tuple(latent.shape[2:]), fps, ref.downscale)
    mask = update_attention_mask(attention, ref.cross(), num_noisy, video.num_tokens, tokens.shape[1])
    return video.append_tokens(tokens, positions, ref.strength), mask


def control_downscale(paths) -> int:
    """The reference downscale of a set of IC-LoRA files, from their metadata, as upstream 1.0.0's
    `ICLoraPipeline` reads it: factors other than 1 must agree. Unlike DFR's detailing LoRA (default 2)
    a control LoRA without `reference_downscale_factor` is refused: the factor must match training."""
    from ltx_engine.rules.safetensors_header import read_raw_header

    factor = 1
    for path in paths:
        metadata = read_raw_header(path, error=ControlError)[1].get("__metadata__") or {}
        raw = metadata.get("reference_downscale_factor")
        if raw is None or not str(raw).isdigit() or int(raw) < 1:
            raise ControlError(f"{path}: an IC-LoRA without a reference_downscale_factor in its metadata")
        scale = int(raw)
        if scale != 1 and factor not in (1, scale):
            raise ControlError(
                f"{path}: reference_downscale_factor {scale} conflicts with another LoRA's {factor}"
            )
        factor = scale if scale != 1 else factor
    return factor
