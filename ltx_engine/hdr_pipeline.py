"""The HDR IC-LoRA render in one process (`hdr-ic-lora`, LTX-2.5): the oracle a farm graph of encode /
denoise / decode tasks must equal bit for bit.

As the MLX port's `HDRICLoraPipeline.generate` (which follows upstream v1.4; upstream 1.2.0 ran two
stages with LogC3, `ltx_engine.rules.hdr` keeps that transfer for such a LoRA):
1. the SDR clip -> working codes (`hdr.sdr_working`), reflect-padded to a multiple of 32, -> [-1, 1];
   `--high-quality` repeats every frame (2N - 1 frames generated, every other one kept);
2. the VAE encoder encodes it whole: the IC-LoRA reference (downscale 1, strength 1), plus, at every
   DFR seam inside the clip, that one frame encoded alone as a guide (strength 0.95);
3. one full-size stage from noise (distilled sigmas, 8 Euler steps, video only: no audio stream), the
   HDR LoRA fused, the scene embedding as the video context, a generated keyframe slot at every seam;
4. the decode (a parameter: the conv decoder today, the keyframe-aware diffusion decoder once it lands,
   given the slots' latent and their frames) -> [0, 1] codes, cropped, decimated -> `hdr.outputs`.
Token order differs from upstream's (reference, guides, slots): here guides, slots, reference, the
engine's DFR order; attention does not depend on token order, only float summation does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from ltx_engine.conditioning import GUIDE, ImageCondition
from ltx_engine.denoise import (
    StageInputs,
    build_stage_states,
    model_forward,
    stage_marker,
    stage_slots,
)
from ltx_engine.media_stage import attention_mask
from ltx_engine.parallel.sp_denoise import Split, denoise_steps, sp_forward_fn
from ltx_engine.rules import hdr, hdr_lora
from ltx_engine.rules.ic_lora import ControlReference
from ltx_engine.rules.sampling import DISTILLED_SIGMAS, EULER
from ltx_engine.rules.tokens import unpatchify_video

F32 = np.float32
ALIGN = 32
# decode(latent (1, C, F, h, w), slots latent (1, C, K, h, w) or None, slot pixel frames) -> (F, H, W, 3) in [0, 1]
Decode = Callable[[np.ndarray, np.ndarray | None, tuple[int, ...]], np.ndarray]


@dataclass(frozen=True)
class HdrRender:
    """What one HDR IC-LoRA render is asked for (the source's frames, size and fps come with the clip)."""

    fps: float
    seed: int
    video_context: np.ndarray  # (1, S, D): the scene embedding
    transfer: str = hdr.ACESCCT  # the LoRA's `hdr_transform`
    input_colorspace: str = "srgb_gamma"
    exr_colorspace: str = "acescg"
    keyframes: bool = True  # --no-keyframes: plain IC-LoRA
    high_quality: bool = False
    keyframe_strength: float = hdr_lora.KEYFRAME_STRENGTH


def load_video_context(path: str | Path) -> np.ndarray:
    """The scene embedding's `video_context` (or the trainer's `video_prompt_embeds`), float32."""
    if not Path(path).is_file():
        raise hdr_lora.HdrRefusal(
            f"the text-embeddings file {str(path)!r} is missing (from {hdr_lora.HDR_LORA_REPO})"
        )
    tensors = mx.load(str(path))
    for name in ("video_context", "video_prompt_embeds"):
        if name in tensors:
            return np.array(tensors[name].astype(mx.float32))
    raise hdr_lora.HdrRefusal(f"{path}: no video_context or video_prompt_embeds (keys {sorted(tensors)})")


def conv_decode(engine, pack) -> Decode:
    """The pack's conv VAE decoder (keyframes unread), [0, 1] frames."""
    return lambda latent, slots, frames: engine.decode_video(pack, latent)


def pad_frames(frames: np.ndarray, align: int = ALIGN) -> np.ndarray:
    """(F, H, W, 3) -> both sides up to a multiple of `align`: reflect, or edge where reflect cannot reach."""
    _, h, w, _ = frames.shape
    ph, pw = (-h) % align, (-w) % align
    if not (ph or pw):
        return frames
    mode = "reflect" if ph < h and pw < w else "edge"
    return np.pad(frames, ((0, 0), (0, ph), (0, pw), (0, 0)), mode=mode)


def source_codes(source: np.ndarray, render: HdrRender) -> np.ndarray:
    """(F, H, W, 3) source frames -> [0, 1] working codes: uint8 is an SDR clip (srgb_gamma / srgb), float
    an EXR folder's plates (--input-colorspace srgb = scene-linear Rec.709, acescg, acescct)."""
    if np.asarray(source).dtype == np.uint8:
        return hdr.sdr_working(source, render.transfer, render.input_colorspace)
    if render.input_colorspace not in hdr.EXR_INPUT:
        raise hdr.HdrInputError(f"EXR plates' --input-colorspace is one of {', '.join(hdr.EXR_INPUT)}")
    return hdr.exr_working(source, hdr.EXR_INPUT[render.input_colorspace], render.transfer)


def reference_pixels(source: np.ndarray, render: HdrRender) -> np.ndarray:
    """(F, H, W, 3) source frames -> (1, 3, F', H', W') float32 VAE input, sides padded to 32
    (F' = 2F - 1 under --high-quality: every frame twice)."""
    hdr_lora.refuse_frames(source.shape[0])
    pixels = hdr.to_vae_range(pad_frames(source_codes(source, render))).transpose(3, 0, 1, 2)[None]
    if render.high_quality:
        pixels = np.repeat(pixels, 2, axis=2)[:, :, : 2 * source.shape[0] - 1]
    return np.ascontiguousarray(pixels, dtype=F32)


def encode(engine, pack, pixels: np.ndarray) -> np.ndarray:
    return np.array(engine.model(pack, "vae_encoder")(mx.array(pixels)).astype(mx.float32))


def stage_inputs(
    render: HdrRender, pixels: np.ndarray, reference: np.ndarray, guides: tuple, seams: tuple
) -> StageInputs:
    """The one full-size stage: slots and guides at the seams, the reference last (as a control without seams)."""
    _, _, frames, height, width = pixels.shape
    shared = dict(
        frames=frames,
        height=height,
        width=width,
        fps=hdr_lora.conditioning_fps(render.fps),
        seed=render.seed,
        sigmas=list(DISTILLED_SIGMAS),
        contexts={"video_context": render.video_context},
        sampler=EULER,
        images=guides,
    )
    if seams:
        return StageInputs(**shared, slots=seams, reference_latent=reference, reference_downscale=1)
    return StageInputs(**shared, control=ControlReference(reference, downscale=1))


def denoise_video(engine, pack, inputs: StageInputs, split=None, progress=None, resume=None, on_step=None) -> dict:
    """The stage video-only (upstream: `SimpleDenoiser(video_context, None)`, no audio modality). `split`
    (`parallel.sp_denoise.Split`), `resume` or `on_step` take the sequence-parallel forward: the video tokens
    (reference, guides, slots with them) cut by rows, K/V gathered whole, bit-identical to the plain one."""
    video, _ = build_stage_states(inputs, int(pack.config.get("transformer", {}).get("in_channels", 128)))
    model = engine.model(pack, "transformer")
    if inputs.slots and not model.config.use_keyframes_abs_pos_embedding:  # as the port's 2.5 check
        raise hdr_lora.HdrRefusal(
            f"{pack.root}: seam keyframe slots need an LTX-2.5 DiT (use --no-keyframes)"
        )
    marker = stage_marker(inputs, video.num_tokens) if model.config.use_keyframes_abs_pos_embedding else None
    mask = attention_mask(inputs, video.num_tokens)
    start = 0
    if split is None and resume is None and on_step is None:
        forward = lambda v, a, sigma: model_forward(model, v, None, sigma, inputs.contexts, marker, None, mask)  # noqa: E731
    else:
        if resume is not None:
            video, start = resume.video, resume.step
        ex = (split or Split(1)).exchange(video.num_tokens)
        forward = sp_forward_fn(model, inputs.contexts, marker, ex, mask)
    video, _ = denoise_steps(video, None, inputs.sigmas, forward, start, on_step, progress)
    out = {"video_latent": unpatchify_video(video.latent[:, : inputs.video_tokens], inputs.latent_grid)}
    return out | ({"slots": stage_slots(inputs, video)} if inputs.slots else {})


def hdr_ic_lora(engine, packs: tuple, source: np.ndarray, render: HdrRender, decode: Decode) -> dict:
    """The whole render from (F, H, W, 3) source frames (`source_codes`); packs: (the plain pack for the VAE encoder,
    the pack with the HDR LoRA fused for the DiT). Returns the latents, the decoded codes, `linear_709`
    (the HLG master's input) and `exr` (the EXR frames' values)."""
    pack, fused_pack = packs
    frames, height, width = source.shape[:3]
    pixels = reference_pixels(source, render)
    reference = encode(engine, pack, pixels)
    seams = hdr_lora.seam_frames(frames, render.high_quality) if render.keyframes else ()
    guides = tuple(
        ImageCondition(
            encode(engine, pack, pixels[:, :, s : s + 1]), s, render.keyframe_strength, GUIDE, "seam"
        )
        for s in seams
    )
    out = denoise_video(engine, fused_pack, stage_inputs(render, pixels, reference, guides, seams))
    decoded = np.asarray(decode(out["video_latent"], out.get("slots"), seams), F32)[:, :height, :width]
    if render.high_quality:
        decoded = decoded[::2]
    return (
        out
        | {"reference": reference, "codes": decoded}
        | hdr.outputs(decoded, render.transfer, render.exr_colorspace)
    )
